package integration

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/dlq"
	"transferconsumer/event"
)

// A shutdown during a split. A batch of 50 (BATCH_MAX=50 whatever
// TEST_BATCH_MAX says: without a batch there is no split) holds, in its
// second half, a TransferFailed that contradicts a transfer created
// earlier in the batch: the database refuses the whole batch, which is
// split, and from then on the database fails for the first half's events
// (an applier hook answers a transient error for any attempt holding one
// of them), so the first half is retried in place while the second half,
// which would apply, waits behind it. The service is stopped during that
// retry. No event of the second half may have been applied: nothing is
// applied behind a message that goes back. A new service, with the
// database healthy, applies all of it, in order, and dead-letters only
// the contradicting event, as invalid-transition.
func TestShutdownDuringASplitAppliesNothingBehindTheFailure(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	const size = 50
	e.declare(1)
	e.recordApplyOrder()
	from := "acc_sp_" + e.name
	var stream, valid []transfer
	for i := 0; len(stream) < size; i++ {
		if i == 40 {
			wrong := transition(stream[30], event.TransferFailed)
			wrong.Data.AmountMinor++
			stream = append(stream, wrong)
			continue
		}
		tr := newTransfer(from, fmt.Sprintf("acc_st%d_%s", i%5, e.name), int64(10+i))
		stream, valid = append(stream, tr), append(valid, tr)
	}
	refused := stream[40]
	for _, ev := range stream {
		e.publish(ev)
	}

	var mu sync.Mutex
	var first, second []event.Event // the halves of the first attempt the database refused
	inFirst := map[string]bool{}
	var failing atomic.Bool
	var failed atomic.Int64
	app := &hookedInbox{Inbox: db.NewInbox(e.db),
		before: func(evs []event.Event) error {
			if !failing.Load() {
				return nil
			}
			mu.Lock()
			defer mu.Unlock()
			for _, ev := range evs {
				if inFirst[ev.ID] {
					failed.Add(1)
					return event.Transient(errors.New("the database is closed for maintenance (test)"))
				}
			}
			return nil
		},
		after: func(evs []event.Event, err error) {
			mu.Lock()
			defer mu.Unlock()
			if first == nil && len(evs) > 1 && err != nil && holds(evs, refused.EventID) {
				half := len(evs) / 2
				first, second = append([]event.Event(nil), evs[:half]...), append([]event.Event(nil), evs[half:]...)
				for _, ev := range first {
					inFirst[ev.ID] = true
				}
				failing.Store(true)
			}
		},
	}
	batch := func(c *consumer.Config) { c.BatchMax, c.BatchLinger = size, 2*time.Second }
	svc := e.startBounded(e.name+"-a", 1, app, batch)
	waitFor(t, 60*time.Second, "the split's first half retried in place", func() bool { return failed.Load() >= 3 })
	took, ok := svc.stopWithin(30 * time.Second)
	if !ok {
		t.Fatalf("the service did not stop within %s", took)
	}
	mu.Lock()
	t.Logf("the first attempt the database refused held %d events; its first half failed %d times before the stop (in %s)",
		len(first)+len(second), failed.Load(), took.Round(time.Millisecond))
	for _, ev := range second {
		if n := e.inboxRows(ev.ID); n != 0 {
			t.Errorf("event %s of the second half was applied (%d inbox rows) behind the first half, which went back", ev.ID, n)
		}
	}
	mu.Unlock()
	if n := e.inboxCount(); n != 0 {
		t.Errorf("%d events applied before the restart, want none: the first of them failed", n)
	}
	if n := e.ready(dlq.Queue(prefix)); n != 0 {
		t.Errorf("DLQ holds %d before the restart, want 0", n)
	}

	failing.Store(false)
	e.startBounded(e.name+"-b", 1, db.NewInbox(e.db), batch)
	waitFor(t, 60*time.Second, "every valid event applied and the refused one dead-lettered", func() bool {
		return e.inboxCount() == len(valid) && e.ready(dlq.Queue(prefix)) == 1
	})
	e.checkBalances(valid)
	e.checkAccountOrder(valid)
	if s := e.transferState(stream[30].Data.TransferID); s != "created" {
		t.Errorf("the transfer the refused event contradicts is %q, want created", s)
	}
	msgs := e.peekDLQ()
	if len(msgs) != 1 || msgs[0].Properties["message_id"] != refused.EventID || msgs[0].header("x-failure-class") != "invalid-transition" {
		t.Errorf("DLQ %d letters (first: %v, class %v), want only the refused event, invalid-transition", len(msgs), msgs[0].Properties["message_id"], classes(msgs))
	}
}

// A batch slower than APPLY_TIMEOUT, with a consumer timeout shorter than
// the slowness lasts. The database takes a minute for any transaction that
// claims more than 16 events (a trigger counts the claims and sleeps),
// while fewer pass at once: the sleep depends on the batch's size alone,
// not on the machine. APPLY_TIMEOUT cancels each attempt that is too big,
// and the batch is retried in place with half the events until it passes.
// The broker's consumer timeout, 6 s, is shorter than the slow spell
// (which outlasts the test) but longer than halving takes. Every event is
// applied once, in order, and none is dead-lettered; a batch retried whole
// would be returned at every consumer timeout until the delivery limit
// (2) dead-lettered it.
func TestBatchSlowerThanTheApplyTimeoutShrinksUntilItPasses(t *testing.T) {
	e := newEnv(t)
	e.limit = 2
	const size, passes = 50, 16
	e.declare(1)
	e.consumerTimeoutFor(6 * time.Second)
	e.recordApplyOrder()
	e.db.MustExec(fmt.Sprintf(`CREATE FUNCTION slow_big_claims() RETURNS trigger LANGUAGE plpgsql AS $$
		DECLARE n int := coalesce(nullif(current_setting('holes.claims', true), ''), '0')::int + 1;
		BEGIN
			PERFORM set_config('holes.claims', n::text, true);
			IF n > %d THEN
				PERFORM pg_sleep(60);
			END IF;
			RETURN NEW;
		END $$`, passes))
	e.db.MustExec(`CREATE TRIGGER slow_big_claims BEFORE INSERT ON processed_event
		FOR EACH ROW EXECUTE FUNCTION slow_big_claims()`)
	events := e.publishMany(size, 3)

	var mu sync.Mutex
	var timeouts int
	svc := e.startBounded(e.name+"-svc", 1, nil, func(c *consumer.Config) {
		c.BatchMax = size
		c.ApplyTimeout = 500 * time.Millisecond
		observe := c.ObserveRetry
		c.ObserveRetry = func(r consumer.Retry) {
			observe(r)
			if strings.Contains(r.Err.Error(), "cancel") {
				mu.Lock()
				timeouts++
				mu.Unlock()
			}
		}
	})
	waitFor(t, 120*time.Second, "every event applied", func() bool {
		return e.inboxCount() == size || e.ready(dlq.Queue(prefix)) > 0
	})
	mu.Lock()
	defer mu.Unlock()
	if timeouts == 0 {
		t.Fatal("no attempt timed out: the test proves nothing")
	}
	spent := 0
	for _, ev := range events {
		for _, d := range svc.rec.of(ev.EventID) {
			spent = max(spent, int(d.DeliveryCount))
		}
	}
	t.Logf("%d attempts cancelled at APPLY_TIMEOUT; at most %d deliveries spent by one event", timeouts, spent)
	e.checkExactlyOnce(events)
	e.checkAccountOrder(events)
}

// consumerTimeoutFor gives the test's partition queues a consumer timeout
// of d and puts the broker back when the test ends. From 4.0 that is a
// policy in the test's vhost (it goes with the vhost); 3.x has only the
// broker's global consumer_timeout, set through rabbitmqctl. Before 4.3 a
// channel checks the timeout on its tick, a minute by default: it is
// shortened too, when rabbitmqctl reaches the broker.
func (e *env) consumerTimeoutFor(d time.Duration) {
	e.t.Helper()
	v := brokerVersion(e.t, e.b)
	var major, minor int
	fmt.Sscanf(v, "%d.%d", &major, &minor)
	if major < 4 {
		setConsumerTimeout(e.t, rabbitmqctl(e.t), d)
		return
	}
	if major == 4 && minor < 3 {
		setBrokerEnv(e.t, rabbitmqctl(e.t), "channel_tick_interval", d.Milliseconds()/4)
	}
	e.b.mgmt(e.t, http.MethodPut, "/api/policies/"+url.PathEscape(e.vhost)+"/consumer-timeout", map[string]any{
		"pattern": "^" + prefix + `\.\d+$`, "apply-to": "queues", "priority": 10,
		"definition": map[string]any{"consumer-timeout": d.Milliseconds()},
	}, nil)
	waitFor(e.t, 30*time.Second, "the consumer-timeout policy on the partition queues", func() bool {
		var qs []struct {
			Name   string `json:"name"`
			Policy string `json:"policy"`
		}
		e.b.mgmt(e.t, http.MethodGet, "/api/queues/"+url.PathEscape(e.vhost)+"?columns=name,policy", nil, &qs)
		n := 0
		for _, q := range qs {
			if strings.HasPrefix(q.Name, prefix+".") && q.Name != prefix+".dlq" && q.Policy != "consumer-timeout" {
				return false
			}
			n++
		}
		return n > 0
	})
}
