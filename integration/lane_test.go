package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/event"
)

// Each worker keeps a database connection between events, but only while
// one is left over: with a pool smaller than the queues, every queue still
// gets its turn and every event is applied once.
func TestLanesShareAPoolSmallerThanTheQueues(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	small, err := db.Open(context.Background(), e.dbURL, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	const queues = 6
	svc := e.start(queues, db.NewInbox(small))
	var trs []transfer
	for i := range 60 {
		tr := newTransfer(fmt.Sprintf("acc_sp%02d_%s", i, e.name), "acc_sp_to_"+e.name, int64(100+i))
		trs = append(trs, tr)
		e.publish(tr)
	}
	waitFor(t, 60*time.Second, "every event to be decided", func() bool { return svc.rec.count() >= len(trs) })
	var sum int64
	queuesUsed := map[string]bool{}
	for _, tr := range trs {
		ds := svc.rec.of(tr.EventID)
		if len(ds) != 1 || ds[0].Action != consumer.ActionAck || ds[0].Duplicate {
			t.Fatalf("event %s: want applied once, got %+v", tr.EventID, ds)
		}
		queuesUsed[ds[0].Queue] = true
		sum += tr.Data.AmountMinor
	}
	if got := e.balance("acc_sp_to_" + e.name); got != sum {
		t.Errorf("balance %d, want %d", got, sum)
	}
	if len(queuesUsed) < 3 {
		t.Errorf("the events went to %d queues, want several to share the pool", len(queuesUsed))
	}
	if st := small.Stats(); st.MaxOpenConnections != 2 || st.OpenConnections > 2 {
		t.Errorf("pool stats %+v", st)
	}
}

// A statement still running when SHUTDOWN_TIMEOUT ends does not hold the
// shutdown: the service closes its connection (it sends no cancel, which
// could cut short a commit waiting for a standby), the message goes back to
// the queue, the server ends the statement at APPLY_TIMEOUT, its
// statement_timeout, and the next run applies the event once.
func TestShutdownClosesTheConnectionOfAStatementThatOutlivesIt(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	release := e.holdClaims()
	defer release()
	svc := e.startWith(1, nil, func(c *consumer.Config) {
		c.ShutdownTimeout = 300 * time.Millisecond
		c.ApplyTimeout = 10 * time.Second
	})
	tr := newTransfer("acc_sd_"+e.name, "acc_se_"+e.name, 4100)
	e.publish(tr)
	waiting := func() int {
		var n int
		e.db.Get(&n, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'advisory'`)
		return n
	}
	waitFor(t, 30*time.Second, "the apply to wait on the held claim", func() bool { return waiting() == 1 })

	stopped := make(chan struct{})
	go func() { svc.stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("shutdown did not end the held statement within 30 s")
	}
	waitFor(t, 30*time.Second, "the statement to leave the lock at its timeout", func() bool { return waiting() == 0 })
	ds := svc.rec.of(tr.EventID)
	if len(ds) != 1 || ds[0].Action != consumer.ActionRequeue || ds[0].Class != event.ClassShutdown {
		t.Fatalf("want one requeue at shutdown, got %+v", ds)
	}
	if n := e.inboxRows(tr.EventID); n != 0 {
		t.Fatalf("inbox rows = %d after the abandoned attempt, want 0", n)
	}
	release()

	again := e.start(1, nil)
	waitFor(t, 30*time.Second, "the requeued event to be applied", func() bool { return len(again.rec.of(tr.EventID)) > 0 })
	if ds := again.rec.of(tr.EventID); len(ds) != 1 || ds[0].Action != consumer.ActionAck || ds[0].Duplicate || !ds[0].Redelivered {
		t.Errorf("want applied once on redelivery, got %+v", ds)
	}
	if n := e.inboxRows(tr.EventID); n != 1 {
		t.Errorf("inbox rows = %d, want 1", n)
	}
	if got := e.balance(tr.Data.ToAccount); got != tr.Data.AmountMinor {
		t.Errorf("balance = %d, want %d", got, tr.Data.AmountMinor)
	}
	if msgs := e.peekDLQ(); len(msgs) != 0 {
		t.Errorf("DLQ holds %d messages, want none", len(msgs))
	}
}
