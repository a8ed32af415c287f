package integration

import (
	"context"
	"testing"
	"time"

	"transferconsumer/consumer"
	"transferconsumer/event"
)

// A worker stuck in a database call that cannot be interrupted (here an
// Applier that ignores its context, as lib/pq does while it waits in
// PgBouncer's queue for a server connection, where no cancel reaches it)
// does not hold shutdown forever: once SHUTDOWN_TIMEOUT has passed and the
// work in hand was cancelled, the session closes its connection without
// the worker, and the message the worker held goes back to its queue,
// neither acked nor dead-lettered.
func TestShutdownLeavesAWorkerStuckInTheDatabaseBehind(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	entered := make(chan struct{}, 1)
	stuck := make(chan struct{})
	defer close(stuck)
	app := applierFunc(func(ctx context.Context, ev event.Event) (event.Result, error) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-stuck
		return event.Result{}, nil
	})
	svc := e.startWith(1, app, func(c *consumer.Config) { c.ShutdownTimeout = 200 * time.Millisecond })
	tr := newTransfer("acc_s_"+e.name, "acc_t_"+e.name, 700)
	e.publish(tr)
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the event never reached the applier")
	}

	stopped := make(chan struct{})
	go func() { svc.stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(60 * time.Second):
		t.Fatal("shutdown waited for the stuck worker for a minute")
	}
	queue := e.topology(1).Queue(0)
	waitFor(t, 30*time.Second, "the held message back in its queue", func() bool { return e.ready(queue) == 1 })
	if d := svc.rec.of(tr.EventID); len(d) != 0 {
		t.Errorf("the stuck event was decided: %+v, want no decision", d)
	}
	if msgs := e.peekDLQ(); len(msgs) != 0 {
		t.Errorf("DLQ holds %d messages, want none", len(msgs))
	}
}
