package integration

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/event"
	"transferconsumer/retry"
)

// What the tests of the session's end, splits, panics and alarms share
// (holes_*_test.go): a service whose stop is bounded, the real inbox with
// a hook before and after each attempt of its lanes, the test's database
// closed for maintenance, and checks that fail a test without ending it.

// boundedService is a consumer running in the test process, like the
// harness's service, whose stop gives up after a deadline instead of
// waiting forever, so that a shutdown that hangs fails the test instead of
// hanging the run.
type boundedService struct {
	*service
	t      *testing.T
	cancel func()
	done   chan error
	mu     sync.Mutex
	ended  bool
}

// startBounded runs a consumer over app with the harness's settings (and
// configure's), named instance, and waits until every queue has a
// consumer; it is stopped, within 30 s, when the test ends. app nil is the
// real inbox.
func (e *env) startBounded(instance string, queues int, app consumer.Applier, configure func(*consumer.Config)) *boundedService {
	e.t.Helper()
	if app == nil {
		app = db.NewInbox(e.db)
	}
	s := &boundedService{service: &service{instance: instance, rec: &recorder{}}, t: e.t, done: make(chan error, 1)}
	cfg := consumer.Config{
		URLs:            []string{e.amqpURL},
		Topology:        e.topology(queues),
		Declare:         true,
		Instance:        instance,
		ShutdownTimeout: 10 * time.Second,
		ApplyTimeout:    10 * time.Second,
		BatchMax:        batchMax(),
		Retry:           retry.Backoff{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		Reconnect:       retry.Backoff{Min: 50 * time.Millisecond, Max: time.Second},
		Logger: slog.New(slog.NewTextHandler(testWriter{e.t}, &slog.HandlerOptions{Level: testLogLevel()})).
			With("instance", instance),
		Observe: s.rec.add,
		ObserveRetry: func(r consumer.Retry) {
			s.retries.Add(1)
			if r.Queue != "" {
				s.retrying.Store(r.Queue, true)
			}
		},
	}
	if configure != nil {
		configure(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.svc = consumer.New(cfg, app)
	go func() { s.done <- s.svc.Run(ctx) }()
	s.stop = func() {
		if took, ok := s.stopWithin(30 * time.Second); !ok {
			e.t.Errorf("%s did not stop within %s of its shutdown", instance, took.Round(time.Millisecond))
		}
	}
	e.t.Cleanup(s.stop)
	waitFor(e.t, 30*time.Second, instance+" consuming every queue", func() bool {
		return s.svc.State().Consuming == queues
	})
	return s
}

// stopWithin cancels the service's context, as SIGTERM does, and waits at
// most d for Run to return. It reports how long that took and whether it
// returned (an error Run returns fails the test); once it has, a second
// call returns at once.
func (s *boundedService) stopWithin(d time.Duration) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return 0, true
	}
	start := time.Now()
	s.cancel()
	select {
	case err := <-s.done:
		s.ended = true
		if err != nil {
			s.t.Errorf("%s: Run returned %v", s.instance, err)
		}
		return time.Since(start), true
	case <-time.After(d):
		return time.Since(start), false
	}
}

// hookedInbox is the real inbox whose lanes call before ahead of each
// attempt (one event, or a batch in one transaction) and after it, with
// the attempt's error. before may fail the attempt without reaching the
// database, block, or panic. Everything else (probe, outbox, parking) is
// the inbox's own.
type hookedInbox struct {
	*db.Inbox
	before func(evs []event.Event) error
	after  func(evs []event.Event, err error)
}

func (h *hookedInbox) Apply(ctx context.Context, ev event.Event) (event.Result, error) {
	l := h.Lane(0)
	defer l.Close()
	return l.Apply(ctx, ev)
}

func (h *hookedInbox) Lane(timeout time.Duration) event.Lane {
	return &hookedLane{h: h, inner: h.Inbox.Lane(timeout).(consumer.BatchLane)}
}

type hookedLane struct {
	h     *hookedInbox
	inner consumer.BatchLane
}

func (l *hookedLane) attempt(evs []event.Event, run func() error) error {
	if l.h.before != nil {
		if err := l.h.before(evs); err != nil {
			return err
		}
	}
	err := run()
	if l.h.after != nil {
		l.h.after(evs, err)
	}
	return err
}

func (l *hookedLane) Apply(ctx context.Context, ev event.Event) (res event.Result, err error) {
	err = l.attempt([]event.Event{ev}, func() error {
		res, err = l.inner.Apply(ctx, ev)
		return err
	})
	return res, err
}

func (l *hookedLane) ApplyBatch(ctx context.Context, evs []event.Event) (outs []event.Outcome, err error) {
	err = l.attempt(evs, func() error {
		outs, err = l.inner.ApplyBatch(ctx, evs)
		return err
	})
	return outs, err
}

func (l *hookedLane) Close() { l.inner.Close() }

// holds reports whether evs holds the event id.
func holds(evs []event.Event, id string) bool {
	for _, ev := range evs {
		if ev.ID == id {
			return true
		}
	}
	return false
}

// serviceDB opens a pool on the test's database for a service, its
// sessions named app in pg_stat_activity, so that a fault can be aimed at
// the service alone.
func (e *env) serviceDB(app string, maxConns int) *sqlx.DB {
	e.t.Helper()
	u, err := url.Parse(e.dbURL)
	if err != nil {
		e.t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	d, err := db.Open(context.Background(), u.String(), maxConns)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { d.Close() })
	return d
}

// closeForMaintenance closes the test's database to new connections, as a
// DBA does for maintenance (SQLSTATE 55000 to whoever connects), and
// terminates the sessions named app. The returned function opens it
// again; it also runs when the test ends.
func (e *env) closeForMaintenance(app string) (open func()) {
	e.t.Helper()
	admin := sqlx.MustOpen("postgres", e.b.databaseURL)
	var once sync.Once
	open = func() {
		once.Do(func() {
			if _, err := admin.Exec(`ALTER DATABASE ` + pq.QuoteIdentifier(e.name) + ` ALLOW_CONNECTIONS true`); err != nil {
				e.t.Errorf("open the database again: %v", err)
			}
			admin.Close()
		})
	}
	e.t.Cleanup(open)
	admin.MustExec(`ALTER DATABASE ` + pq.QuoteIdentifier(e.name) + ` ALLOW_CONNECTIONS false`)
	admin.MustExec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND application_name = $2`, e.name, app)
	return open
}

// idleInTransaction describes the sessions of the test's database that
// sit idle inside a transaction, with how long and what they last ran.
func (e *env) idleInTransaction() []string {
	e.t.Helper()
	var rows []struct {
		PID   int     `db:"pid"`
		Age   float64 `db:"age"`
		Query string  `db:"query"`
	}
	if err := e.db.Select(&rows, `SELECT pid, extract(epoch FROM now() - state_change)::float8 AS age, left(query, 60) AS query
		FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`); err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, r := range rows {
		out = append(out, fmt.Sprintf("pid %d for %.1fs after %q", r.PID, r.Age, r.Query))
	}
	return out
}

// eventually polls cond until it holds or timeout passes, and reports
// whether it held: waitFor for a check that should fail the test without
// ending it, so that the checks after it still say what they see.
func eventually(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	var p poll
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		p.pause()
	}
	return true
}

// dlqByMessageID returns the dead letters by message_id.
func dlqByMessageID(msgs []dlqMessage) map[string][]dlqMessage {
	out := map[string][]dlqMessage{}
	for _, m := range msgs {
		id, _ := m.Properties["message_id"].(string)
		out[id] = append(out[id], m)
	}
	return out
}

// checkMoney asserts that every balance is the sum of what movers moved
// (each once, duplicates in the list ignored), and that they sum to zero;
// unlike checkBalances it does not count the inbox, so that it also holds
// when transitions, which move nothing, were applied too.
func (e *env) checkMoney(movers []transfer) {
	e.t.Helper()
	want := map[string]int64{}
	seen := map[string]bool{}
	for _, ev := range movers {
		if !seen[ev.EventID] {
			seen[ev.EventID] = true
			want[ev.Data.FromAccount] -= ev.Data.AmountMinor
			want[ev.Data.ToAccount] += ev.Data.AmountMinor
		}
	}
	var rows []struct {
		Account string `db:"account"`
		Balance int64  `db:"balance_minor"`
	}
	if err := e.db.Select(&rows, `SELECT account, balance_minor FROM balance_projection`); err != nil {
		e.t.Fatal(err)
	}
	var wrong []string
	var sum int64
	for _, r := range rows {
		sum += r.Balance
		if r.Balance != want[r.Account] {
			wrong = append(wrong, fmt.Sprintf("%s=%d (want %d)", r.Account, r.Balance, want[r.Account]))
		}
	}
	if len(rows) != len(want) || len(wrong) > 0 || sum != 0 {
		e.t.Errorf("%d accounts (want %d), sum %d; wrong balances: %v", len(rows), len(want), sum, wrong)
	}
}
