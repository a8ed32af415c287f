package integration

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/dlq"
	"transferconsumer/event"
)

// The operator's path: dead letters pile up, someone looks at them many
// times in the management UI, fixes the cause, and replays. Looking loses
// nothing; the replay applies the fixed event once; replaying an event that
// was already applied changes no balance; what the filter leaves out stays.
func TestReplayAfterFixIsSafe(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.limit = 2
	inbox := db.NewInbox(e.db)
	var fixed atomic.Bool
	broken := "acc_broken_" + e.name
	app := applierFunc(func(ctx context.Context, ev event.Event) (event.Result, error) {
		if ev.Transfer.ToAccount == broken && !fixed.Load() {
			panic("a bug this account's events reach") // until it is fixed
		}
		return inbox.Apply(ctx, ev)
	})
	svc := e.start(2, app)
	from := "acc_r_" + e.name

	stuck := newTransfer(from, broken, 900)
	applied := newTransfer(from, "acc_ok_"+e.name, 100)
	e.publish(stuck)
	e.publish(applied)
	waitFor(t, 30*time.Second, "the stuck event in the DLQ and the other applied", func() bool {
		return len(e.peekDLQ()) == 1 && len(svc.rec.of(applied.EventID)) == 1
	})
	// An already-applied event lands in the DLQ too (say, a copy moved there
	// by hand), and a poison message.
	e.publishRaw(dlq.Exchange(prefix), from, applied.body(), applied.EventID)
	e.publishRaw(dlq.Exchange(prefix), from, []byte("garbage"), "")

	// Looking is harmless on every version: 30 looks, past 4.x's default
	// delivery limit of 20 (the DLQ has none).
	for i := 0; i < 30; i++ {
		if n := len(e.peekDLQ()); n != 3 {
			t.Fatalf("peek %d: DLQ holds %d messages, want 3", i+1, n)
		}
	}
	t.Logf("RabbitMQ %s: the DLQ looked at 30 times with requeue through the management API, 3 letters still there",
		brokerVersion(t, shared))

	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sum, err := dlq.List(conn, prefix, 10)
	if err != nil || sum.Total != 3 || len(sum.Letters) != 3 {
		t.Fatalf("List = %+v, %v; want 3 letters", sum, err)
	}
	byClass := map[string]int{}
	for _, g := range sum.Groups {
		byClass[g.Class] += g.Count
	}
	if byClass["panic"] != 1 {
		t.Errorf("groups %+v: want one panic letter", sum.Groups)
	}

	dry, err := dlq.Replay(conn, prefix, dlq.Filter{}, 0, true)
	if err != nil || dry.Scanned != 3 || len(dry.Replayed) != 3 {
		t.Errorf("dry run = %+v, %v; want 3 scanned and 3 that would be replayed", dry, err)
	}
	if n := len(e.peekDLQ()); n != 3 {
		t.Fatalf("after a dry run the DLQ holds %d, want 3", n)
	}

	fixed.Store(true)
	r, err := dlq.Replay(conn, prefix, dlq.Filter{Class: "panic"}, 0, false)
	if err != nil || len(r.Replayed) != 1 || r.Replayed[0].EventID != stuck.EventID {
		t.Fatalf("replay of panic letters = %+v, %v; want the stuck event", r, err)
	}
	r, err = dlq.Replay(conn, prefix, dlq.Filter{EventID: applied.EventID}, 0, false)
	if err != nil || len(r.Replayed) != 1 {
		t.Fatalf("replay of the applied event = %+v, %v", r, err)
	}
	waitFor(t, 30*time.Second, "both replays decided", func() bool {
		s := svc.rec.of(stuck.EventID)
		return len(s) > 0 && s[len(s)-1].Action == consumer.ActionAck && len(svc.rec.of(applied.EventID)) == 2
	})

	if got := e.balance(broken); got != 900 {
		t.Errorf("fixed account = %d, want 900 (applied once by the replay)", got)
	}
	if got := e.balance("acc_ok_" + e.name); got != 100 {
		t.Errorf("already-applied account = %d, want 100 (the replay changed nothing)", got)
	}
	if got := e.balance(from); got != -1000 {
		t.Errorf("source account = %d, want -1000", got)
	}
	if last := svc.rec.of(applied.EventID)[1]; !last.Duplicate {
		t.Errorf("replayed applied event: want duplicate, got %+v", last)
	}
	left := e.peekDLQ()
	if len(left) != 1 || left[0].Payload != "garbage" {
		t.Errorf("DLQ = %+v, want only the poison message the filters left out", left)
	}
}

// A letter that fails again as soon as it is replayed comes back to the
// DLQ's tail, newer than the retention cut-off and of the same class, while
// the run is still going. The run must still end, having put back each
// letter that was there when it started once, and no letter of its own.
func TestReplayRunEndsWhileItsLettersFailAgain(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	inbox := db.NewInbox(e.db)
	run := randomSuffix()
	rejected := "acc_rej_" + run
	app := applierFunc(func(ctx context.Context, ev event.Event) (event.Result, error) {
		if ev.Transfer.ToAccount == rejected {
			return event.Result{}, event.Rejected(errors.New("the database refuses this account's events"))
		}
		return inbox.Apply(ctx, ev)
	})
	svc := e.start(2, app)

	// Enough letters that the first ones are back in the DLQ long before a
	// run reaches the last.
	const n = 40
	ids := map[string]bool{}
	for i := 0; i < n; i++ {
		tr := newTransfer(fmt.Sprintf("acc_from_%d_%s", i, run), rejected, 100)
		ids[tr.EventID] = true
		e.publish(tr)
	}
	e.publishRaw(dlq.Exchange(prefix), "acc_x", []byte("garbage"), "") // class unknown: no filter here takes it
	waitFor(t, 30*time.Second, "every event dead-lettered", func() bool { return e.ready(dlq.Queue(prefix)) == n+1 })

	conn, err := amqp.DialConfig(e.amqpURL, amqp.Config{Properties: amqp.Table{"connection_name": e.name + "-replay"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// failedAgain counts the replayed events the consumer has dead-lettered
	// once more: each is then back in the DLQ (the copy is confirmed first).
	failedAgain := func(times int) int {
		k := 0
		for id := range ids {
			if len(svc.rec.of(id)) >= times {
				k++
			}
		}
		return k
	}
	type result struct {
		r        dlq.ReplayReport
		err      error
		backThen int
	}
	done := make(chan result, 1)
	go func() {
		r, err := dlq.Replay(conn, prefix, dlq.Filter{Class: "data-rejected"}, 0, false) // no limit
		done <- result{r, err, failedAgain(2)}
	}()
	var res result
	waitFor(t, 60*time.Second, "the replay run to end", func() bool {
		select {
		case res = <-done:
			return true
		default:
			return false
		}
	})
	r := res.r
	if res.err != nil {
		t.Fatalf("replay: %v", res.err)
	}
	t.Logf("run %s: depth %d, scanned %d, replayed %d; %d of them already back in the DLQ when it ended",
		r.Run, r.Depth, r.Scanned, len(r.Replayed), res.backThen)
	if res.backThen == 0 {
		t.Fatal("no replayed letter was back in the DLQ before the run ended: the test shows nothing")
	}
	if r.Depth != n+1 || r.Scanned != n+1 {
		t.Errorf("depth %d, scanned %d; want both %d, the DLQ at the start", r.Depth, r.Scanned, n+1)
	}
	if len(r.Replayed) != n {
		t.Errorf("replayed %d letters, want %d: each original once", len(r.Replayed), n)
	}
	seen := map[string]int{}
	for _, l := range r.Replayed {
		seen[l.EventID]++
	}
	for id := range ids {
		if seen[id] != 1 {
			t.Errorf("event %s replayed %d times, want once", id, seen[id])
		}
	}

	waitFor(t, 30*time.Second, "every replayed letter dead-lettered again", func() bool { return failedAgain(2) == n })
	waitFor(t, 30*time.Second, "the DLQ to hold them again", func() bool { return e.ready(dlq.Queue(prefix)) == n+1 })
	if k := failedAgain(3); k != 0 {
		t.Errorf("%d events delivered a third time: the run replayed its own letters", k)
	}
	marked := 0
	for _, m := range e.peekDLQ() {
		if m.header(dlq.HeaderReplayRun) == r.Run {
			marked++
		}
	}
	if marked != n {
		t.Errorf("%d letters in the DLQ carry x-replay-run %s, want %d: the mark must survive dead-lettering", marked, r.Run, n)
	}

	// A later run is a new run: it may try them again, once each.
	r2, err := dlq.Replay(conn, prefix, dlq.Filter{Class: "data-rejected"}, 0, false)
	if err != nil || len(r2.Replayed) != n || r2.Run == r.Run {
		t.Fatalf("second run = %d replayed (run %s), %v; want %d under a new run id", len(r2.Replayed), r2.Run, err, n)
	}
	waitFor(t, 30*time.Second, "the second run's letters dead-lettered again", func() bool { return failedAgain(3) == n })
	if k := failedAgain(4); k != 0 {
		t.Errorf("%d events delivered a fourth time", k)
	}
}
