package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lib/pq"
	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/consumer"
	"transferconsumer/event"
)

func accountNames(n int, suffix string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("acc_%02d_%s", i, suffix)
	}
	return out
}

// Hot accounts: transfers in both directions among 10 accounts over 8 queues
// at full speed, with completions and reversals. Rows are locked in a fixed
// order, so no deadlock (40P01) or serialization failure (40001) ever
// reaches a decision, and the balances are exact.
func TestHotAccountsNeverDeadlock(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(8)
	events := lifecycleStream(2000, accountNames(10, e.name))
	var mu sync.Mutex
	var contention []string
	svc := e.startWith(8, nil, func(c *consumer.Config) {
		observe := c.ObserveRetry
		c.ObserveRetry = func(r consumer.Retry) {
			if s := r.Err.Error(); strings.Contains(s, "deadlock") || strings.Contains(s, "serializ") {
				// PostgreSQL's detail names the processes and the locks of
				// the cycle, and the context the statement it was in.
				if pe, ok := errors.AsType[*pq.Error](r.Err); ok {
					s += "; detail: " + pe.Detail + "; where: " + pe.Where
				}
				mu.Lock()
				contention = append(contention, s)
				mu.Unlock()
			}
			observe(r)
		}
	})
	var published atomic.Int64
	if err := e.publishPipelined(events, &published); err != nil {
		t.Fatal(err)
	}
	unique := uniqueEvents(events)
	start := time.Now()
	waitFor(t, 120*time.Second, "every event applied", func() bool { return e.inboxCount() == unique })
	elapsed := time.Since(start)

	svc.rec.mu.Lock()
	for _, d := range svc.rec.all {
		if d.Err != nil && d.Class != event.ClassTransition {
			t.Errorf("decision with an error: %+v", d)
		}
	}
	svc.rec.mu.Unlock()
	mu.Lock()
	if len(contention) > 0 {
		t.Errorf("%d deadlock or serialization retries, want none: %v", len(contention), strings.Join(contention, "\n"))
	}
	mu.Unlock()
	e.checkLifecycle(events)
	t.Logf("hot accounts: %d messages (%d unique) among 10 accounts over 8 queues in %s; %d in-place retries, none for deadlocks",
		len(events), unique, elapsed.Round(time.Millisecond), svc.retries.Load())
}

func uniqueEvents(events []transfer) int {
	seen := map[string]bool{}
	for _, ev := range events {
		seen[ev.EventID] = true
	}
	return len(seen)
}

// recordApplyOrder makes the test database log the order in which inbox
// claims commit, so that per-account order can be checked afterwards.
func (e *env) recordApplyOrder() {
	e.db.MustExec(`CREATE SEQUENCE apply_seq`)
	e.db.MustExec(`CREATE TABLE apply_log (event_id UUID PRIMARY KEY, seq BIGINT NOT NULL)`)
	e.db.MustExec(`CREATE FUNCTION log_apply() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO apply_log VALUES (NEW.event_id, nextval('apply_seq'));
			RETURN NEW;
		END $$`)
	e.db.MustExec(`CREATE TRIGGER log_apply AFTER INSERT ON processed_event
		FOR EACH ROW EXECUTE FUNCTION log_apply()`)
}

// checkAccountOrder asserts that each fromAccount's events were applied in
// the order they were published.
func (e *env) checkAccountOrder(events []transfer) {
	e.t.Helper()
	var rows []struct {
		ID  string `db:"event_id"`
		Seq int64  `db:"seq"`
	}
	if err := e.db.Select(&rows, `SELECT event_id, seq FROM apply_log`); err != nil {
		e.t.Fatal(err)
	}
	seq := map[string]int64{}
	for _, r := range rows {
		seq[r.ID] = r.Seq
	}
	last := map[string]int64{}
	inversions := 0
	for _, ev := range events {
		s, ok := seq[ev.EventID]
		if !ok || s == -1 {
			continue // a duplicate, already checked at its first copy
		}
		seq[ev.EventID] = -1
		if s < last[ev.Data.FromAccount] {
			inversions++
			if inversions <= 3 {
				e.t.Errorf("account %s: event %s applied out of publishing order", ev.Data.FromAccount, ev.EventID)
			}
		}
		last[ev.Data.FromAccount] = s
	}
	if inversions > 0 {
		e.t.Errorf("%d events applied out of their account's order", inversions)
	}
}

// Two replicas consume the same queues; single active consumer keeps one
// consumer per queue. One replica is SIGKILLed mid-stream: its queues move to
// the other, the message it had in hand comes back first, every event is
// applied once and each account's events in publishing order.
func TestReplicaKilledMidStream(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(4)
	e.recordApplyOrder()
	events := lifecycleStream(1500, accountNames(12, e.name))

	a := startProcess(t, e.serviceEnv(4, "INSTANCE_NAME="+e.name+"-a", "REPLICA_COUNT=2", "REPLICA_INDEX=0"))
	a.waitConsuming(1)
	b := startProcess(t, e.serviceEnv(4, "INSTANCE_NAME="+e.name+"-b", "REPLICA_COUNT=2", "REPLICA_INDEX=1"))
	b.waitConsuming(1)

	var published atomic.Int64
	pubErr := make(chan error, 1)
	go func() { pubErr <- e.publishPipelined(events, &published) }()
	waitFor(t, 60*time.Second, "a third of the stream applied", func() bool { return e.inboxCount() >= len(events)/3 })
	aApplied := a.count("outcome", "applied")
	a.stop(syscall.SIGKILL, 10*time.Second)
	if err := <-pubErr; err != nil {
		t.Fatal(err)
	}
	unique := uniqueEvents(events)
	waitFor(t, 90*time.Second, "every event applied", func() bool { return e.inboxCount() == unique })
	if err := b.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("replica b: exit %v after SIGTERM", err)
	}

	e.checkLifecycle(events)
	e.checkAccountOrder(events)
	t.Logf("replicas: %d messages (%d unique); a applied %d before SIGKILL, b applied %d and saw %d redeliveries",
		len(events), unique, aApplied, b.count("outcome", "applied"), b.count("redelivered", "true"))
}

// Raising the queue count from 4 to 8 while events flow, by the documented
// procedure: Grow binds the new queues and waits for the old ones to drain,
// then a service with 8 queues replaces the one with 4. The end state is
// exact; the test prints how many accounts changed queue.
func TestRepartitionFourToEight(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(4)
	events := lifecycleStream(2000, accountNames(40, e.name))
	account := map[string]string{}
	for _, ev := range events {
		account[ev.EventID] = ev.Data.FromAccount
	}

	old := e.start(4, nil)
	// The first half is published before the change, the second from the
	// moment the new queues are bound.
	half := len(events) / 2
	var published atomic.Int64
	pubErr := make(chan error, 2)
	go func() { pubErr <- e.publishPipelined(events[:half], &published) }()
	waitFor(t, 60*time.Second, "a quarter of the stream applied", func() bool { return e.inboxCount() >= half/2 })
	var secondHalf sync.Once
	progress := func(msg string) {
		t.Log("grow: " + msg)
		secondHalf.Do(func() { go func() { pubErr <- e.publishPipelined(events[half:], &published) }() })
	}

	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := e.topology(4).Grow(ctx, conn, 8, progress); err != nil {
		t.Fatal(err)
	}
	grown := e.start(8, nil)
	old.stop()
	for i := 0; i < 2; i++ {
		if err := <-pubErr; err != nil {
			t.Fatal(err)
		}
	}
	unique := uniqueEvents(events)
	waitFor(t, 90*time.Second, "every event applied", func() bool { return e.inboxCount() == unique })
	grown.stop()

	e.checkLifecycle(events)
	queuesOf := map[string]map[string]bool{}
	for _, rec := range []*recorder{old.rec, grown.rec} {
		rec.mu.Lock()
		for _, d := range rec.all {
			a := account[d.EventID]
			if queuesOf[a] == nil {
				queuesOf[a] = map[string]bool{}
			}
			queuesOf[a][d.Queue] = true
		}
		rec.mu.Unlock()
	}
	moved := 0
	for _, qs := range queuesOf {
		if len(qs) > 1 {
			moved++
		}
	}
	t.Logf("repartition 4 → 8: %d of %d accounts changed queue; %d messages (%d unique) applied exactly once",
		moved, len(queuesOf), len(events), unique)
	if moved == 0 {
		t.Error("no account changed queue: the new bindings did not take effect")
	}
}
