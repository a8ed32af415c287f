package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/dlq"
	"transferconsumer/event"
)

// A broker session ends during a memory alarm, with valid events behind a
// poison message. Before the alarm: on one key a poison message followed
// by 30 valid events, and on other keys (some on the other queue) valid
// events with poison among them. Under the alarm the broker confirms no
// dead-letter copy, so the service parks each dead letter in the database
// and acks the message, and the valid events behind it go on. The
// service's consuming connection is closed (as an operator or a network
// fault would) while a batch behind the first poison is being applied;
// the service comes back and finishes. Every valid event is applied, once,
// while the alarm is still on; each poison message is parked once during
// the alarm, and its letter reaches the DLQ, with its x-failure-class and
// x-failure-reason, after the alarm clears (twice at most: a copy whose
// wait revealed the alarm may land too, adr/0002).
func TestSessionEndDuringAnAlarmWithValidEventsBehindAPoison(t *testing.T) {
	e := newEnv(t)
	ctl := rabbitmqctl(t)
	const queues = 2
	e.declare(queues)
	top := e.topology(queues)
	depth := func() []int {
		out := make([]int, queues)
		for i := range out {
			out[i] = e.ready(top.Queue(i))
		}
		return out
	}
	poison := func(key string) string {
		id := newUUID()
		e.publishRaw(prefix, key, []byte(`{"eventId": "`+id+`", "not json`), id)
		return id
	}
	var valid []transfer
	var poisons []string
	head := "acc_head_" + e.name
	poisons = append(poisons, poison(head))
	headQueue := 0
	if depth()[1] == 1 {
		headQueue = 1
	}
	for i := 0; i < 30; i++ {
		tr := newTransfer(head, fmt.Sprintf("acc_hd%d_%s", i%4, e.name), int64(1+i))
		valid = append(valid, tr)
		e.publish(tr)
	}
	gate := valid[15] // the batch that holds it waits until the session has ended
	// Other keys: those on the other queue carry a poison among their
	// valid events; those on the poison's queue, behind its 30, only valid
	// ones (a poison there would wait behind the batch the test holds).
	onOther := 0
	for k := 0; k < 16 && (k < 4 || onOther < 2); k++ {
		key := fmt.Sprintf("acc_o%02d_%s", k, e.name)
		before := depth()
		for i := 0; i < 6; i++ {
			if i == 3 && depth()[1-headQueue] > before[1-headQueue] {
				poisons = append(poisons, poison(key))
				continue
			}
			tr := newTransfer(key, head, int64(100+10*k+i))
			valid = append(valid, tr)
			e.publish(tr)
		}
		if depth()[1-headQueue] > before[1-headQueue] {
			onOther++
		}
	}
	if onOther == 0 {
		t.Fatal("no key went to the other queue")
	}

	reached := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	var gated sync.Once
	app := &hookedInbox{Inbox: db.NewInbox(e.db), before: func(evs []event.Event) error {
		if holds(evs, gate.EventID) {
			gated.Do(func() {
				close(reached)
				<-release
			})
		}
		return nil
	}}

	clearAlarm := setMemoryAlarm(t, ctl)
	svc := e.startBounded(e.name+"-svc", queues, app, nil)
	select {
	case <-reached:
	case <-time.After(60 * time.Second):
		t.Fatalf("the valid events behind the poison were not applied during the alarm: the batch holding event %s never reached the database (%d of %d valid events applied)",
			gate.EventID, e.inboxCount(), len(valid))
	}
	// Every poison is parked and acked before the session ends, so that
	// none comes back to be parked a second time.
	waitFor(t, 60*time.Second, "every poison dead-lettered (parked) during the alarm", func() bool {
		for _, id := range poisons {
			ds := svc.rec.of(id)
			if len(ds) == 0 || ds[len(ds)-1].Action != consumer.ActionDeadLetter {
				return false
			}
		}
		return true
	})
	e.closeConnections(svc.instance)
	once.Do(func() { close(release) })

	waitFor(t, 60*time.Second, "every valid event applied during the alarm", func() bool {
		return e.inboxCount() == len(valid)
	})
	if !memoryAlarm(t) {
		t.Fatal("the alarm passed before the test could look: the result proves nothing")
	}
	if n := e.ready(dlq.Queue(prefix)); n != 0 {
		t.Errorf("DLQ holds %d during the alarm, want 0: no copy can have been confirmed", n)
	}
	var parked int
	if err := e.db.GetContext(context.Background(), &parked, `SELECT count(*) FROM dead_letter_outbox`); err != nil {
		t.Fatal(err)
	}
	if parked != len(poisons) {
		t.Errorf("%d dead letters parked during the alarm, want the %d poison messages, each once", parked, len(poisons))
	}

	clearAlarm()
	waitFor(t, 60*time.Second, "the parked dead letters published after the alarm", func() bool {
		return e.ready(dlq.Queue(prefix)) >= len(poisons)
	})
	waitFor(t, 30*time.Second, "every queue empty", func() bool {
		d := depth()
		return d[0] == 0 && d[1] == 0
	})
	e.checkBalances(valid)
	// Parked once each; a copy abandoned when the alarm showed may land
	// too when the session that waited for its answer ended (adr/0002),
	// so a letter may be there twice, never more, never not at all, and
	// nothing else is.
	letters := e.peekDLQ()
	byID := dlqByMessageID(letters)
	doubled := 0
	for _, id := range poisons {
		ls := byID[id]
		ok := len(ls) == 1 || len(ls) == 2
		for _, m := range ls {
			ok = ok && m.header("x-failure-class") == "poison" && m.header("x-failure-reason") != nil && m.header("x-failure-reason") != ""
		}
		if !ok {
			var at []any
			for _, m := range ls {
				at = append(at, m.header("x-failed-at"))
			}
			t.Errorf("poison %s: %d dead letters, classes %v, reasons %v, failed at %v; want one (or two), poison, with a reason",
				id, len(ls), classes(ls), reasons(ls), at)
		}
		if len(ls) == 2 {
			doubled++
		}
		delete(byID, id)
	}
	if len(byID) != 0 {
		t.Errorf("the DLQ holds letters of other messages than the poison ones: %v", byID)
	}
	t.Logf("%d of the %d poison letters reached the DLQ twice (a copy abandoned when the alarm showed, and the parked one)", doubled, len(poisons))
	t.Logf("BATCH_MAX=%d: %d valid events and %d poison messages, %d keys on the other queue; the session ended while event %s's batch was applied",
		batchMax(), len(valid), len(poisons), onOther, gate.EventID)
}

// Dead letters on every queue at once during a memory alarm: a poison
// message at the head of each of four queues, valid events behind each.
// The first copy to go out meets the alarm; every other worker, whether it
// sees the alarm before its copy or while its copy goes out, parks its
// letter and goes on. Every valid event is applied while the alarm is on,
// and every poison reaches the DLQ after it.
func TestDeadLettersOnEveryQueueAtOnceDuringAnAlarmAreParked(t *testing.T) {
	e := newEnv(t)
	ctl := rabbitmqctl(t)
	const queues = 4
	e.declare(queues)
	top := e.topology(queues)
	keys := map[int]string{} // a key per queue, whose poison is at the queue's head
	var poisons []string     // every poison published, some behind the heads
	for k := 0; len(keys) < queues; k++ {
		if k == 400 {
			t.Fatalf("400 keys did not reach every queue: %v", keys)
		}
		key := fmt.Sprintf("acc_q%03d_%s", k, e.name)
		before := make([]int, queues)
		for q := range before {
			before[q] = e.ready(top.Queue(q))
		}
		id := newUUID()
		e.publishRaw(prefix, key, []byte(`{"eventId": "`+id+`", "not json`), id)
		poisons = append(poisons, id)
		for q := range before {
			if _, ok := keys[q]; !ok && e.ready(top.Queue(q)) > before[q] {
				keys[q] = key
			}
		}
	}
	var valid []transfer
	for _, key := range keys {
		for i := 0; i < 5; i++ {
			tr := newTransfer(key, "acc_sink_"+e.name, int64(1+i))
			valid = append(valid, tr)
			e.publish(tr)
		}
	}

	clearAlarm := setMemoryAlarm(t, ctl)
	e.startBounded(e.name+"-svc", queues, nil, nil)
	if !eventually(60*time.Second, func() bool { return e.inboxCount() == len(valid) }) {
		t.Fatalf("%d of the %d valid events behind the poison messages applied during the alarm, want all: a queue waits on its dead letter's copy",
			e.inboxCount(), len(valid))
	}
	if !memoryAlarm(t) {
		t.Fatal("the alarm passed before the test could look: the result proves nothing")
	}
	clearAlarm()
	waitFor(t, 60*time.Second, "every poison in the DLQ", func() bool {
		byID := dlqByMessageID(e.peekDLQ())
		for _, id := range poisons {
			if len(byID[id]) == 0 {
				return false
			}
		}
		return true
	})
	e.checkBalances(valid)
	// No session ended: each copy an alarm cut short is confirmed once it
	// passes, and its parked letter is dropped, not published again.
	waitFor(t, 60*time.Second, "the parked letters gone from the outbox", func() bool { return e.outboxCount() == 0 })
	byID := dlqByMessageID(e.peekDLQ())
	for _, id := range poisons {
		if n := len(byID[id]); n != 1 {
			t.Errorf("poison %s: %d dead letters, want one", id, n)
		}
	}
}
