package integration

// The seed's test matrix: each case asserts the business effect (balances,
// inbox rows, queue and DLQ contents), never merely that a message was acked.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/event"
)

// Case 1: the same event published twice is applied once.
func TestMatrix1ExactDuplicate(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	svc := e.start(2, nil)
	tr := newTransfer("acc_a_"+e.name, "acc_b_"+e.name, 10000)

	e.publish(tr)
	e.publish(tr)
	waitFor(t, 20*time.Second, "two decisions", func() bool { return len(svc.rec.of(tr.EventID)) == 2 })

	decisions := svc.rec.of(tr.EventID)
	if decisions[0].Duplicate || !decisions[1].Duplicate {
		t.Errorf("want applied then duplicate, got %+v", decisions)
	}
	for _, d := range decisions {
		if d.Action != consumer.ActionAck {
			t.Errorf("want both acked, got %s (%v)", d.Action, d.Err)
		}
	}
	if n := e.inboxRows(tr.EventID); n != 1 {
		t.Errorf("inbox rows = %d, want 1", n)
	}
	if got := e.balance(tr.Data.ToAccount); got != 10000 {
		t.Errorf("to balance = %d, want 10000", got)
	}
	if got := e.balance(tr.Data.FromAccount); got != -10000 {
		t.Errorf("from balance = %d, want -10000", got)
	}
}

// crashAfterCommit applies with the real inbox, then kills the consumer's
// broker connection before the handler can ack: the commit happened, the
// ack cannot.
type crashAfterCommit struct {
	next  consumer.Applier
	crash func()
	once  sync.Once
}

func (c *crashAfterCommit) Apply(ctx context.Context, ev event.Event) (event.Result, error) {
	res, err := c.next.Apply(ctx, ev)
	if err == nil {
		c.once.Do(c.crash)
	}
	return res, err
}

// Case 2: the connection dies between commit and ack; the broker redelivers
// and the inbox turns the redelivery into a duplicate.
func TestMatrix2CrashBetweenCommitAndAck(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	app := &crashAfterCommit{next: db.NewInbox(e.db)}
	svc := e.start(2, app)
	app.crash = func() { e.closeConnections(svc.instance) }
	tr := newTransfer("acc_a_"+e.name, "acc_b_"+e.name, 2500)

	e.publish(tr)
	waitFor(t, 30*time.Second, "the redelivery to be acked", func() bool {
		for _, d := range svc.rec.of(tr.EventID) {
			if d.Redelivered && d.Action == consumer.ActionAck {
				return true
			}
		}
		return false
	})

	ds := svc.rec.of(tr.EventID)
	last := ds[len(ds)-1]
	if !last.Duplicate || !last.Redelivered {
		t.Errorf("want the redelivery discarded as duplicate, got %+v", last)
	}
	if ds[0].Duplicate {
		t.Errorf("first delivery should have applied the event, got %+v", ds[0])
	}
	if n := e.inboxRows(tr.EventID); n != 1 {
		t.Errorf("inbox rows = %d, want 1", n)
	}
	if got := e.balance(tr.Data.ToAccount); got != 2500 {
		t.Errorf("to balance = %d, want 2500 (moved once)", got)
	}
	for i := 0; i < 2; i++ {
		if n := e.ready(e.topology(2).Queue(i)); n != 0 {
			t.Errorf("queue %d holds %d messages, want 0", i, n)
		}
	}
}

// Case 3: the balance change fails after the inbox claim. A trigger on the
// projection raises once for the target account (a sequence is not rolled
// back, so "once" survives the rollback it causes).
func TestMatrix3EffectFailsAfterClaim(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	target := "acc_fail_" + e.name
	e.db.MustExec(`CREATE SEQUENCE fail_once`)
	e.db.MustExec(fmt.Sprintf(`
		CREATE FUNCTION fail_first_write() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.account = '%s' AND nextval('fail_once') = 1 THEN
				RAISE EXCEPTION 'injected failure writing %%', NEW.account;
			END IF;
			RETURN NEW;
		END $$`, target))
	e.db.MustExec(`CREATE TRIGGER fail_first_write BEFORE INSERT OR UPDATE ON balance_projection
		FOR EACH ROW EXECUTE FUNCTION fail_first_write()`)

	// While the failed delivery is still in hand (not yet rejected), look
	// at the inbox from outside the transaction: the claim must be gone.
	var mu sync.Mutex
	var inboxAfterFailure []int
	app := applierFunc(func(ctx context.Context, ev event.Event) (event.Result, error) {
		res, err := db.NewInbox(e.db).Apply(ctx, ev)
		if err != nil {
			mu.Lock()
			inboxAfterFailure = append(inboxAfterFailure, e.inboxRows(ev.ID))
			mu.Unlock()
		}
		return res, err
	})
	svc := e.start(2, app)
	tr := newTransfer("acc_src_"+e.name, target, 700)

	e.publish(tr)
	waitFor(t, 30*time.Second, "the event to be applied", func() bool {
		for _, d := range svc.rec.of(tr.EventID) {
			if d.Action == consumer.ActionAck {
				return true
			}
		}
		return false
	})

	// The failure did not come from the message, so it was retried in
	// place: one decision, after one retry, on the first delivery.
	ds := svc.rec.of(tr.EventID)
	if len(ds) != 1 || ds[0].Action != consumer.ActionAck || ds[0].Retries != 1 || ds[0].Redelivered || ds[0].Duplicate {
		t.Fatalf("want the event applied after one retry in place, got %+v", ds)
	}
	mu.Lock()
	if len(inboxAfterFailure) != 1 || inboxAfterFailure[0] != 0 {
		t.Errorf("inbox rows right after the failed attempt = %v, want [0]: the claim must roll back with the effect", inboxAfterFailure)
	}
	mu.Unlock()
	if n := e.inboxRows(tr.EventID); n != 1 {
		t.Errorf("inbox rows = %d, want 1", n)
	}
	if got := e.balance(target); got != 700 {
		t.Errorf("target balance = %d, want 700 (applied exactly once)", got)
	}
	if got := e.balance(tr.Data.FromAccount); got != -700 {
		t.Errorf("source balance = %d, want -700", got)
	}
}

type applierFunc func(context.Context, event.Event) (event.Result, error)

func (f applierFunc) Apply(ctx context.Context, ev event.Event) (event.Result, error) {
	return f(ctx, ev)
}

// Case 4: poison (malformed JSON, invalid fields) goes to the DLQ after one
// delivery, is never applied, and the valid event behind it on the same
// queue is applied.
func TestMatrix4Poison(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(2)
	from, to := "acc_p_"+e.name, "acc_q_"+e.name

	badJSON := []byte(`{"eventId": "not closed`)
	invalid := newTransfer(from, to, 100)
	invalid.Data.AmountMinor = -100
	valid := newTransfer(from, to, 300)
	// Published before the consumer starts, so the poison is at the head of
	// the queue and the valid event waits behind it.
	e.publishRaw(prefix, from, badJSON, "")
	e.publish(invalid)
	e.publish(valid)
	svc := e.start(2, nil)

	waitFor(t, 20*time.Second, "three decisions", func() bool { return svc.rec.count() == 3 })
	svc.rec.mu.Lock()
	ds := append([]consumer.Decision(nil), svc.rec.all...)
	svc.rec.mu.Unlock()
	for i, d := range ds[:2] {
		if d.Action != consumer.ActionDeadLetter || d.Class != event.ClassPoison || d.DeliveryCount != 0 || d.Redelivered {
			t.Errorf("decision %d: want poison dead-lettered on its first delivery, got %+v", i, d)
		}
	}
	if ds[2].EventID != valid.EventID || ds[2].Action != consumer.ActionAck || ds[2].Duplicate {
		t.Errorf("want the valid event applied last, got %+v", ds[2])
	}

	if got := e.balance(to); got != 300 {
		t.Errorf("balance = %d, want 300 (only the valid event)", got)
	}
	if n := e.inboxRows(invalid.EventID); n != 0 {
		t.Errorf("the invalid event has %d inbox rows, want 0", n)
	}
	msgs := e.peekDLQ()
	if len(msgs) != 2 {
		t.Fatalf("DLQ holds %d messages, want 2", len(msgs))
	}
	queue := ""
	for _, d := range ds {
		queue = d.Queue
	}
	for _, m := range msgs {
		if m.RoutingKey != from {
			t.Errorf("dead letter routing key = %q, want the original %q", m.RoutingKey, from)
		}
		want := map[string]any{
			"x-failure-class": "poison", "x-original-queue": queue, "x-original-exchange": prefix,
			"x-original-routing-key": from, "x-failed-by": svc.instance, "x-original-delivery-count": float64(0),
		}
		for k, v := range want {
			if m.header(k) != v {
				t.Errorf("dead letter header %s = %v, want %v", k, m.header(k), v)
			}
		}
		if at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(m.header("x-failed-at"))); err != nil || time.Since(at) > time.Minute {
			t.Errorf("x-failed-at = %v, want the time it failed", m.header("x-failed-at"))
		}
		if reason, _ := m.header("x-failure-reason").(string); reason == "" {
			t.Errorf("dead letter has no reason: %v", m.Properties["headers"])
		}
	}
	if !strings.Contains(fmt.Sprint(msgs[1].header("x-failure-reason")), "amountMinor") {
		t.Errorf("reason of the invalid event = %v, want it to name amountMinor", msgs[1].header("x-failure-reason"))
	}
}

// barrier holds each event's first two applications until both have
// arrived, then lets them race into the database together.
type barrier struct {
	next  consumer.Applier
	mu    sync.Mutex
	gates map[string]*gate
}

type gate struct {
	n    int
	open chan struct{}
}

func (b *barrier) Apply(ctx context.Context, ev event.Event) (event.Result, error) {
	b.mu.Lock()
	g := b.gates[ev.ID]
	if g == nil {
		g = &gate{open: make(chan struct{})}
		b.gates[ev.ID] = g
	}
	g.n++
	if g.n == 2 {
		close(g.open)
	}
	b.mu.Unlock()
	select {
	case <-g.open:
	case <-time.After(15 * time.Second): // the other delivery never came; the assertions will say so
	case <-ctx.Done():
		return event.Result{}, ctx.Err()
	}
	return b.next.Apply(ctx, ev)
}

// Case 5: the same event delivered to two consumers at the same moment has
// exactly one effect. Repeated 20 times: a hidden check-then-act fails only
// sometimes.
func TestMatrix5ConcurrentDuplicates(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	app := &barrier{next: db.NewInbox(e.db), gates: map[string]*gate{}}
	svc := e.start(2, app)
	top := e.topology(2)
	from, to := "acc_c_"+e.name, "acc_d_"+e.name

	var want int64
	for i := 0; i < 20; i++ {
		t.Run(fmt.Sprintf("iteration_%02d", i+1), func(t *testing.T) {
			tr := newTransfer(from, to, int64(i+1))
			// Each queue has its own consumer; putting the event on both
			// delivers it twice at once.
			e.publishRaw("", top.Queue(0), tr.body(), tr.EventID)
			e.publishRaw("", top.Queue(1), tr.body(), tr.EventID)
			waitFor(t, 20*time.Second, "both deliveries decided", func() bool { return len(svc.rec.of(tr.EventID)) == 2 })

			applied := 0
			for _, d := range svc.rec.of(tr.EventID) {
				if d.Action != consumer.ActionAck {
					t.Errorf("want ack, got %s (%v)", d.Action, d.Err)
				}
				if !d.Duplicate {
					applied++
				}
			}
			if applied != 1 {
				t.Errorf("%d deliveries applied the event, want exactly 1", applied)
			}
			if n := e.inboxRows(tr.EventID); n != 1 {
				t.Errorf("inbox rows = %d, want 1", n)
			}
			want += tr.Data.AmountMinor
			if got := e.balance(to); got != want {
				t.Errorf("balance = %d, want %d", got, want)
			}
		})
	}
}

// Case 6: the database connection is killed mid-transaction. The service's
// transaction is held at a trigger (waiting on an advisory lock the test
// owns) after its inbox claim; the test terminates that backend with
// pg_terminate_backend, then lets go. The event is retried in place, neither
// lost nor dead-lettered, and applied once.
func TestMatrix6DatabaseConnectionKilledMidTransaction(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	release := e.holdClaims()
	defer release()

	svc := e.start(2, nil)
	tr := newTransfer("acc_k_"+e.name, "acc_l_"+e.name, 4200)
	e.publish(tr)

	var pid int
	waitFor(t, 20*time.Second, "the service's transaction to wait mid-way", func() bool {
		err := e.db.Get(&pid, `SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'advisory'
			LIMIT 1`)
		return err == nil
	})
	var killed bool
	if err := e.db.Get(&killed, `SELECT pg_terminate_backend($1)`, pid); err != nil || !killed {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, killed, err)
	}
	release()

	waitFor(t, 30*time.Second, "the event to be decided", func() bool { return len(svc.rec.of(tr.EventID)) > 0 })
	e.checkAppliedInPlace(svc, tr, 1)
}

// APPLY_TIMEOUT bounds one attempt: a statement that waits longer (here at a
// trigger, on an advisory lock the test owns) is cancelled on the server,
// its transaction rolls back, and the event is retried in place on the same
// delivery. Once the lock is free it is applied once.
func TestApplyTimeoutCancelsTheStatementAndRetriesInPlace(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	release := e.holdClaims()
	defer release()
	var mu sync.Mutex
	var retryErrs []string
	svc := e.startWith(1, nil, func(c *consumer.Config) {
		c.ApplyTimeout = 300 * time.Millisecond
		observe := c.ObserveRetry
		c.ObserveRetry = func(r consumer.Retry) {
			mu.Lock()
			retryErrs = append(retryErrs, r.Err.Error())
			mu.Unlock()
			observe(r)
		}
	})
	tr := newTransfer("acc_m_"+e.name, "acc_n_"+e.name, 3100)
	e.publish(tr)

	waitFor(t, 30*time.Second, "three attempts to time out", func() bool { return svc.retries.Load() >= 3 })
	mu.Lock()
	for _, msg := range retryErrs {
		if !strings.Contains(msg, "canceling statement due to statement timeout") {
			t.Errorf("an attempt ended otherwise than cancelled on the server: %s", msg)
		}
	}
	mu.Unlock()
	// Each cancelled attempt let go of its backend: at most the current
	// attempt waits on the lock.
	var waiting int
	e.db.Get(&waiting, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'advisory'`)
	if waiting > 1 {
		t.Errorf("%d backends wait on the lock, want at most 1", waiting)
	}
	release()

	waitFor(t, 30*time.Second, "the event to be decided", func() bool { return len(svc.rec.of(tr.EventID)) > 0 })
	e.checkAppliedInPlace(svc, tr, 3)
}

// checkAppliedInPlace checks that tr was decided once: applied on its first
// delivery after at least minRetries in-place retries, one inbox row, its
// amount credited, nothing dead-lettered.
func (e *env) checkAppliedInPlace(svc *service, tr transfer, minRetries int) {
	e.t.Helper()
	ds := svc.rec.of(tr.EventID)
	if len(ds) != 1 {
		e.t.Fatalf("want one decision, got %+v", ds)
	}
	if d := ds[0]; d.Action != consumer.ActionAck || d.Duplicate || d.Retries < minRetries || d.Redelivered || d.DeliveryCount != 0 {
		e.t.Errorf("want applied on the first delivery after at least %d in-place retries, got %+v", minRetries, d)
	}
	if n := e.inboxRows(tr.EventID); n != 1 {
		e.t.Errorf("inbox rows = %d, want 1", n)
	}
	if got := e.balance(tr.Data.ToAccount); got != tr.Data.AmountMinor {
		e.t.Errorf("balance = %d, want %d", got, tr.Data.AmountMinor)
	}
	if msgs := e.peekDLQ(); len(msgs) != 0 {
		e.t.Errorf("DLQ holds %d messages, want none", len(msgs))
	}
}

// holdClaims makes every apply wait, right after its inbox claim, on an
// advisory lock the test holds (a trigger on processed_event takes it),
// until the returned release is called; calling it again does nothing.
func (e *env) holdClaims() (release func()) {
	e.t.Helper()
	const lockKey = 60606
	e.db.MustExec(fmt.Sprintf(`
		CREATE FUNCTION hold_claim() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			PERFORM pg_advisory_xact_lock(%d);
			RETURN NEW;
		END $$`, lockKey))
	e.db.MustExec(`CREATE TRIGGER hold_claim AFTER INSERT ON processed_event
		FOR EACH ROW EXECUTE FUNCTION hold_claim()`)
	ctx := context.Background()
	holder, err := e.db.Connx(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := holder.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, lockKey); err != nil {
		holder.Close()
		e.t.Fatal(err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			if _, err := holder.ExecContext(ctx, `SELECT pg_advisory_unlock($1)`, lockKey); err != nil {
				e.t.Error(err)
			}
			holder.Close()
		})
	}
}
