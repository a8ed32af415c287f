package integration

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/event"
)

// A message whose handling panics is retried in place, on its first
// delivery, as long as the bug may be the service's; after three panics of
// the event alone it is dead-lettered as the message's own fault, with
// class panic and the panic as its reason. The event behind it on the same
// queue is applied after it, once, and no delivery of either is spent. (A
// process that dies instead is ended by the queue's delivery limit.)
func TestPanicIsRetriedInPlaceThenDeadLettered(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.limit = 3
	inbox := db.NewInbox(e.db)
	var attempts atomic.Int64
	var broken string
	app := applierFunc(func(ctx context.Context, ev event.Event) (event.Result, error) {
		if ev.ID == broken {
			attempts.Add(1)
			var m map[string]int
			m[ev.ID]++ // a bug that only this message reaches
		}
		return inbox.Apply(ctx, ev)
	})
	from := "acc_u_" + e.name
	bad, good := newTransfer(from, "acc_v_"+e.name, 10), newTransfer(from, "acc_v_"+e.name, 20)
	broken = bad.EventID
	e.declare(2)
	e.publish(bad)
	e.publish(good)
	svc := e.start(2, app)

	waitFor(t, 30*time.Second, "the event behind it to be applied", func() bool {
		ds := svc.rec.of(good.EventID)
		return len(ds) > 0 && ds[len(ds)-1].Action == consumer.ActionAck
	})
	waitFor(t, 10*time.Second, "the panicking event in the DLQ", func() bool { return len(e.peekDLQ()) == 1 })

	ds := svc.rec.of(bad.EventID)
	if len(ds) != 1 || ds[0].Action != consumer.ActionDeadLetter || ds[0].Class != event.ClassPanic || ds[0].DeliveryCount != 0 {
		t.Errorf("decisions about the panicking event = %+v; want one dead letter of class panic on its first delivery", ds)
	}
	// Three times alone; with batches, once more in the batch it came in
	// with, before the split set it apart.
	if got := attempts.Load(); got != 3 && !(batchMax() > 1 && got == 4) {
		t.Errorf("the panicking event was handled %d times, want 3 (4 with batches)", got)
	}
	if g := svc.rec.of(good.EventID); len(g) != 1 || g[0].DeliveryCount != 0 {
		t.Errorf("decisions about the event behind = %+v; want one ack on its first delivery", g)
	}
	m := e.peekDLQ()[0]
	if m.header("x-failure-class") != "panic" || !strings.Contains(fmt.Sprint(m.header("x-failure-reason")), "nil map") ||
		m.RoutingKey != from {
		t.Errorf("dead letter: class %v, reason %v, key %q; want panic, the panic, and %q",
			m.header("x-failure-class"), m.header("x-failure-reason"), m.RoutingKey, from)
	}
	if got := e.balance("acc_v_" + e.name); got != 20 {
		t.Errorf("balance = %d, want 20 (only the good event)", got)
	}
}

// An error nobody classified (a new driver error, a code path that fails
// for every message) stops the line, it does not empty it: the message is
// retried in place far past the delivery limit, the queue is reported
// blocked, nothing is dead-lettered, and once the cause is gone the event is
// applied on its first delivery.
func TestUnclassifiedErrorBlocksTheQueueInsteadOfDeadLettering(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.limit = 2
	inbox := db.NewInbox(e.db)
	var fixed atomic.Bool
	app := applierFunc(func(ctx context.Context, ev event.Event) (event.Result, error) {
		if !fixed.Load() {
			return event.Result{}, errors.New("a bug nobody classified")
		}
		return inbox.Apply(ctx, ev)
	})
	svc := e.start(2, app)
	tr := newTransfer("acc_uc_"+e.name, "acc_ud_"+e.name, 42)
	e.publish(tr)
	waitFor(t, 30*time.Second, "retries far past the delivery limit", func() bool {
		return svc.retries.Load() >= int64(5*(e.limit+1))
	})
	if n := svc.rec.count(); n != 0 {
		t.Errorf("%d decisions while the bug lasts, want none", n)
	}
	if b := svc.svc.State().Blocked; len(b) != 1 || b[0].Class != event.ClassUnknown || b[0].EventID != tr.EventID {
		t.Errorf("blocked queues = %+v, want the event's queue, class unknown", b)
	}
	fixed.Store(true)
	waitFor(t, 30*time.Second, "the event applied once fixed", func() bool { return len(svc.rec.of(tr.EventID)) == 1 })
	if d := svc.rec.of(tr.EventID)[0]; d.Action != consumer.ActionAck || d.DeliveryCount != 0 || d.Redelivered {
		t.Errorf("want applied on its first delivery, got %+v", d)
	}
	if b := svc.svc.State().Blocked; len(b) != 0 {
		t.Errorf("still reported blocked: %+v", b)
	}
	if got := e.balance(tr.Data.ToAccount); got != 42 {
		t.Errorf("balance = %d, want 42", got)
	}
	if n := len(e.peekDLQ()); n != 0 {
		t.Errorf("DLQ holds %d, want none", n)
	}
}

// The database goes away for longer than the delivery limit times the retry
// interval. Transient failures are retried in place: the queue waits with
// one message in hand per queue, nothing is dead-lettered, no delivery count
// is spent, and every event is applied once when the database is back.
func TestDatabaseOutageDeadLettersNothing(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.limit = 2
	u, _ := url.Parse(e.dbURL)
	p := newProxy(t, u.Host)
	u.Host = p.addr
	proxied, err := db.Open(context.Background(), u.String(), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer proxied.Close()
	svc := e.start(2, db.NewInbox(proxied))

	p.down()
	const n = 12
	events := make([]transfer, n)
	want := map[string]int64{}
	for i := range events {
		events[i] = newTransfer(fmt.Sprintf("acc_%d_%s", i%4, e.name), "acc_sink_"+e.name, int64(100+i))
		want[events[i].Data.FromAccount] -= events[i].Data.AmountMinor
		want[events[i].Data.ToAccount] += events[i].Data.AmountMinor
		e.publish(events[i])
	}
	// Far more retries than the delivery limit allows returns.
	waitFor(t, 30*time.Second, "retries well past the delivery limit", func() bool {
		return svc.retries.Load() >= int64(4*(e.limit+1))
	})
	top := e.topology(2)
	held := n - e.ready(top.Queue(0)) - e.ready(top.Queue(1))
	if want := svc.retryingQueues(); batchMax() == 1 && held != want || held > want*batchMax() {
		t.Errorf("%d messages taken from the queues during the outage, want %d, at most BATCH_MAX=%d in hand per queue with events",
			held, want, batchMax())
	}
	if svc.rec.count() != 0 {
		t.Errorf("decisions made while the database was down: %+v", svc.rec.all)
	}

	p.up()
	waitFor(t, 60*time.Second, "every event to be applied", func() bool { return svc.rec.count() >= n })
	for _, ev := range events {
		ds := svc.rec.of(ev.EventID)
		if len(ds) != 1 || ds[0].Action != consumer.ActionAck || ds[0].Duplicate || ds[0].Redelivered || ds[0].DeliveryCount != 0 {
			t.Errorf("event %s: want applied on its first delivery, got %+v", ev.EventID, ds)
		}
		if rows := e.inboxRows(ev.EventID); rows != 1 {
			t.Errorf("event %s has %d inbox rows, want 1", ev.EventID, rows)
		}
	}
	for account, b := range want {
		if got := e.balance(account); got != b {
			t.Errorf("%s = %d, want %d", account, got, b)
		}
	}
	if msgs := e.peekDLQ(); len(msgs) != 0 {
		t.Errorf("DLQ holds %d messages, want none", len(msgs))
	}
}

// The same eventId with other content is not applied: it is dead-lettered as
// a producer conflict, recorded for alerting, and the first version stands.
func TestProducerConflictIsDeadLetteredAndCounted(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	svc := e.start(2, nil)
	original := newTransfer("acc_m_"+e.name, "acc_n_"+e.name, 500)
	forged := original
	forged.Data.AmountMinor = 50000

	e.publish(original)
	e.publish(forged)
	waitFor(t, 20*time.Second, "both decisions", func() bool { return len(svc.rec.of(original.EventID)) == 2 })

	d := svc.rec.of(original.EventID)[1]
	if d.Action != consumer.ActionDeadLetter || d.Class != event.ClassConflict {
		t.Errorf("second version: want dead-lettered as producer conflict, got %+v", d)
	}
	if got := e.balance(original.Data.ToAccount); got != 500 {
		t.Errorf("balance = %d, want 500 (the first version only)", got)
	}
	var conflicts int
	e.db.Get(&conflicts, `SELECT count(*) FROM producer_conflict WHERE event_id = $1`, original.EventID)
	if conflicts != 1 {
		t.Errorf("producer_conflict rows = %d, want 1", conflicts)
	}
	msgs := e.peekDLQ()
	if len(msgs) != 1 || msgs[0].header("x-failure-class") != "producer-conflict" {
		t.Fatalf("DLQ = %+v, want the forged version as producer-conflict", msgs)
	}
}

// An event whose values our own statement refuses, the same way on every
// attempt (here 22003: the target's balance would overflow a BIGINT), is
// the message's fault: dead-lettered on its first delivery with the
// service's reason headers, never applied, and the queue goes on.
func TestDataTheDatabaseRejectsIsDeadLetteredAtOnce(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	rich := "acc_rich_" + e.name
	e.db.MustExec(`INSERT INTO balance_projection (account, balance_minor) VALUES ($1, 9223372036854775000)`, rich)
	svc := e.start(2, nil)
	from := "acc_f_" + e.name
	overflow, after := newTransfer(from, rich, 10_000), newTransfer(from, "acc_g_"+e.name, 5)
	e.publish(overflow)
	e.publish(after)
	waitFor(t, 30*time.Second, "both decided", func() bool {
		return len(svc.rec.of(overflow.EventID)) == 1 && len(svc.rec.of(after.EventID)) == 1
	})
	d := svc.rec.of(overflow.EventID)[0]
	if d.Action != consumer.ActionDeadLetter || d.Class != event.ClassRejected || d.DeliveryCount != 0 || d.Retries != 0 {
		t.Errorf("want dead-lettered as data-rejected on the first delivery, got %+v", d)
	}
	msgs := e.peekDLQ()
	if len(msgs) != 1 {
		t.Fatalf("DLQ holds %d, want the overflowing event", len(msgs))
	}
	m := msgs[0]
	reason := fmt.Sprint(m.header("x-failure-reason"))
	if m.header("x-failure-class") != "data-rejected" || !strings.Contains(reason, "out of range") ||
		m.header("x-original-delivery-count") != float64(0) || m.RoutingKey != from {
		t.Errorf("dead letter: class %v, reason %q, delivery count %v, key %q", m.header("x-failure-class"), reason,
			m.header("x-original-delivery-count"), m.RoutingKey)
	}
	if n := e.inboxRows(overflow.EventID); n != 0 {
		t.Errorf("the refused event left %d inbox rows, want 0", n)
	}
	if got := e.balance(from); got != -5 {
		t.Errorf("source balance = %d, want -5 (the refused event not applied)", got)
	}
}
