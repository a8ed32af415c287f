package integration

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"transferconsumer/consumer"
	"transferconsumer/db"
)

// A message whose handling always fails with an unknown error is requeued
// with Reject until the quorum queue's delivery limit dead-letters it: after
// exactly limit+1 deliveries, with reason delivery_limit. The event behind it
// on the same queue is applied.
func TestUnknownErrorEndsInDLQAtTheDeliveryLimit(t *testing.T) {
	e := newEnv(t)
	e.limit = 3
	inbox := db.NewInbox(e.db)
	var attempts atomic.Int64
	var broken string
	app := applierFunc(func(ctx context.Context, ev consumer.Event) (consumer.Result, error) {
		if ev.ID == broken {
			attempts.Add(1)
			return consumer.Result{}, errors.New("a bug nobody classified")
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
		return len(ds) == 1 && ds[0].Action == consumer.ActionAck
	})
	waitFor(t, 10*time.Second, "the failing event in the DLQ", func() bool { return len(e.peekDLQ()) == 1 })

	if got, want := attempts.Load(), int64(e.limit+1); got != want {
		t.Errorf("the failing event was delivered %d times, want limit+1 = %d", got, want)
	}
	for i, d := range svc.rec.of(bad.EventID) {
		if d.Action != consumer.ActionRequeue || d.Class != consumer.ClassUnknown || d.DeliveryCount != int64(i) {
			t.Errorf("delivery %d: want requeue of an unknown error with x-delivery-count %d, got %+v", i, i, d)
		}
	}
	m := e.peekDLQ()[0]
	if m.header("x-first-death-reason") != "delivery_limit" || m.RoutingKey != from {
		t.Errorf("dead letter: reason %v, key %q; want delivery_limit and %q", m.header("x-first-death-reason"), m.RoutingKey, from)
	}
	if got := e.balance("acc_v_" + e.name); got != 20 {
		t.Errorf("balance = %d, want 20 (only the good event)", got)
	}
}

// The database goes away for longer than the delivery limit times the retry
// interval. Transient failures are retried in place: the queue waits with
// one message in hand per queue, nothing is dead-lettered, no delivery count
// is spent, and every event is applied once when the database is back.
func TestDatabaseOutageDeadLettersNothing(t *testing.T) {
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
	if want := svc.retryingQueues(); held != want {
		t.Errorf("%d messages taken from the queues during the outage, want %d (one in hand per queue with events)", held, want)
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
	e := newEnv(t)
	svc := e.start(2, nil)
	original := newTransfer("acc_m_"+e.name, "acc_n_"+e.name, 500)
	forged := original
	forged.Data.AmountMinor = 50000

	e.publish(original)
	e.publish(forged)
	waitFor(t, 20*time.Second, "both decisions", func() bool { return len(svc.rec.of(original.EventID)) == 2 })

	d := svc.rec.of(original.EventID)[1]
	if d.Action != consumer.ActionDeadLetter || d.Class != consumer.ClassConflict {
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
