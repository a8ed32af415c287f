package db

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"transferconsumer/consumer"
)

// Inbox applies events to the balance projection and the transfers'
// states, each exactly once in effect. It implements consumer.Applier and
// consumer.Lanes.
type Inbox struct {
	db *sqlx.DB

	mu    sync.Mutex                // held to prepare apply and to reset pids
	apply atomic.Pointer[sqlx.Stmt] // prepared once, re-prepared by database/sql per connection
	pids  sync.Map                  // driver connection → its server process
	npids atomic.Int64              // entries in pids
}

// NewInbox returns an Inbox over db.
func NewInbox(db *sqlx.DB) *Inbox { return &Inbox{db: db} }

// Apply claims ev.ID in the inbox and applies its effect in the same local
// transaction, then commits. The work is one call of the apply_event
// function (sql/0004_apply_event.sql), so an event costs three round trips:
// BEGIN, the call, COMMIT.
//
// The claim comes first and is an INSERT, not a lookup: two deliveries of one
// event racing each other both try to insert, the primary key lets exactly
// one win, and the loser waits for the winner's commit and finds the row. A
// check-then-insert would let both decide to apply. Because claim and effect
// share the transaction, a failed effect rolls the claim back too, and the
// redelivery applies it.
//
// It returns Result{Duplicate: true} when ev.ID was applied before with the
// same content; a consumer.Conflict error when it was applied with other
// content (after recording the conflict in producer_conflict); a
// consumer.Transition error when a lifecycle event contradicts its transfer
// (nothing is written then, the claim included); a consumer.Transient error
// when the database is unreachable or asks for a retry (serialization
// failure, deadlock), or when ctx ended the attempt; any other error as is.
//
// Apply takes a connection for this one call; a worker applying event after
// event uses a Lane, which keeps its connection.
func (in *Inbox) Apply(ctx context.Context, ev consumer.Event) (consumer.Result, error) {
	l := in.Lane(0)
	defer l.Close()
	return l.Apply(ctx, ev)
}

// Lane returns a consumer.Lane: it applies one worker's events, one at a
// time, on a connection it keeps between them, and bounds each attempt by
// timeout itself (0: only by the context given to Apply).
//
// A statement is never handed a cancellable context: given one, database/sql
// and lib/pq start a goroutine per statement to watch it, three per event,
// which cost about 40 µs of CPU per event here (BENCHMARKS.md). When an
// attempt's time is up, or the context given to Apply ends while a statement
// runs, the lane asks the server, from another connection, to cancel its
// connection's server process (pg_cancel_backend). What the cancel
// interrupts rolls back; the error is transient, so the event is retried in
// place. A connection a cancel was sent for is discarded, never reused, so a
// late cancel cannot reach another statement. Per event, the timeout and
// the watch cost no allocation and no goroutine: a timer reset and stopped,
// a mutex taken twice (ADR 0005, second addendum).
func (in *Inbox) Lane(timeout time.Duration) consumer.Lane {
	return &lane{in: in, timeout: timeout}
}

// keepConns reports whether a lane may keep its connection after an event:
// only while another connection is left for everyone else (another lane, a
// cancel, the readiness check, retention). With a pool smaller than the
// queues (DB_MAX_CONNS), or shared, the last lanes to take one return it
// after every event, so that no queue waits on a connection a lane sits on.
func (in *Inbox) keepConns() bool {
	st := in.db.Stats()
	return st.MaxOpenConnections == 0 || st.MaxOpenConnections-st.InUse >= 1
}

type lane struct {
	in      *Inbox
	timeout time.Duration

	// Owned by the goroutine calling Apply.
	conn      *sqlx.Conn // kept between events; nil until needed and after a failure
	timer     *time.Timer
	watched   context.Context // the context stopWatch watches
	stopWatch func() bool

	mu        sync.Mutex // guards what the timer and the watch touch
	pid       int        // conn's server process
	active    bool       // a transaction is running on conn
	deadline  time.Time  // of the running attempt, when timeout > 0
	cancelled bool       // a cancel was sent for conn
}

func (l *lane) Apply(ctx context.Context, ev consumer.Event) (consumer.Result, error) {
	outcome, err := l.run(ctx, ev)
	if err != nil {
		return consumer.Result{}, fmt.Errorf("apply event %s: %w", ev.ID, translate(err))
	}
	switch {
	case outcome == "applied":
		return consumer.Result{}, nil
	case outcome == "applied+outbox":
		return consumer.Result{Outbox: true}, nil
	case outcome == "duplicate":
		return consumer.Result{Duplicate: true}, nil
	case strings.HasPrefix(outcome, "conflict:"):
		return consumer.Result{}, consumer.Conflict(fmt.Errorf(
			"producer conflict: event %s was applied with content fingerprint %s, this delivery has %x",
			ev.ID, strings.TrimPrefix(outcome, "conflict:"), ev.Fingerprint))
	}
	return consumer.Result{}, fmt.Errorf("apply event %s: unexpected outcome %q", ev.ID, outcome)
}

// run runs ev's transaction on the lane's connection and returns
// apply_event's outcome.
func (l *lane) run(ctx context.Context, ev consumer.Event) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	stmt, err := l.in.statement(ctx)
	if err != nil {
		return "", err
	}
	if l.conn == nil {
		if err := l.pin(ctx); err != nil {
			return "", err
		}
	}
	if ctx != l.watched {
		if l.stopWatch != nil {
			l.stopWatch()
		}
		l.watched, l.stopWatch = ctx, context.AfterFunc(ctx, func() { l.cancel(false) })
	}

	l.mu.Lock()
	l.active = true
	if l.timeout > 0 {
		l.deadline = time.Now().Add(l.timeout)
	}
	l.mu.Unlock()
	if l.timeout > 0 {
		if l.timer == nil {
			l.timer = time.AfterFunc(l.timeout, func() { l.cancel(true) })
		} else {
			l.timer.Reset(l.timeout)
		}
	}

	t := ev.Transfer
	// A transition keeps its message, in case it waits for its creation and
	// then contradicts it (sql/0006): a creation never needs it.
	var m struct {
		key, id, contentType *string
		body, headers        []byte
	}
	if ev.Type != consumer.EventTransferCreated {
		m.key, m.id, m.contentType = &ev.Message.RoutingKey, &ev.Message.MessageID, &ev.Message.ContentType
		m.body, m.headers = ev.Message.Body, consumer.HeadersJSON(ev.Message.Headers)
	}
	var outcome string
	var cancelled, ended bool
	end := func() {
		if !ended {
			ended, cancelled = true, l.end()
		}
	}
	quiet := context.Background()
	err = inTx(quiet, l.conn, func(tx *sqlx.Tx) error {
		if err := tx.StmtContext(quiet, stmt.Stmt).QueryRowContext(quiet,
			ev.ID, ev.Type, ev.Fingerprint, t.ID, t.FromAccount, t.ToAccount, t.AmountMinor, t.Currency,
			m.key, m.body, jsonb(m.headers), m.id, m.contentType).Scan(&outcome); err != nil {
			return err
		}
		// The COMMIT is never cancelled: a cancel that lands while it waits
		// for a synchronous standby makes PostgreSQL report success for a
		// commit that is only local. So no cancel may start from here on,
		// and a transaction a cancel was already sent for rolls back
		// instead of committing; the event is retried.
		end()
		if cancelled {
			return errCancelled
		}
		return nil
	})
	end()
	switch {
	case cancelled:
		// The cancel may yet reach the server after this transaction ended:
		// the connection must not run anyone's next statement.
		l.conn.Raw(func(any) error { return driver.ErrBadConn })
		l.unpin()
		if ctx.Err() == nil {
			err = fmt.Errorf("%w (cancelled after %s)", err, l.timeout)
		}
	case err != nil:
		// A fresh connection is simpler to trust than one that failed in a
		// transaction.
		l.unpin()
	case !l.in.keepConns():
		l.unpin()
	}
	return outcome, err
}

// errCancelled is the error of an attempt whose statement a cancel was sent
// for: it is rolled back, never committed.
var errCancelled = errors.New("attempt cancelled before its commit")

// end ends the attempt's cancellable part: it stops the timer, and once it
// holds mu no cancel can start for this transaction any more (a cancel
// being sent holds mu until it is sent). It reports whether one was sent.
func (l *lane) end() bool {
	if l.timer != nil {
		l.timer.Stop()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.active = false
	cancelled := l.cancelled
	l.cancelled = false
	return cancelled
}

// pin takes a connection for the lane and asks for its server process,
// within the lane's timeout.
func (l *lane) pin(ctx context.Context) error {
	if l.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.timeout)
		defer cancel()
	}
	conn, err := l.in.db.Connx(ctx)
	if err != nil {
		return err
	}
	pid, err := l.in.backendPID(ctx, conn)
	if err != nil {
		conn.Close()
		return err
	}
	l.conn = conn
	l.mu.Lock()
	l.pid = pid
	l.mu.Unlock()
	return nil
}

func (l *lane) unpin() {
	l.conn.Close()
	l.conn = nil
}

// cancel cancels the running transaction on the server, if there is one
// and, for the timer (atDeadline), if its deadline has passed: a timer that
// fired just as the previous attempt ended finds the next one's deadline
// ahead and leaves it alone.
func (l *lane) cancel(atDeadline bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.active || l.cancelled || atDeadline && time.Now().Before(l.deadline) {
		return
	}
	l.cancelled = true
	l.in.cancelBackend(l.pid)
}

// Close returns the lane's connection to the pool and stops its timer and
// its watch; the lane is not used again. A second Close does nothing.
func (l *lane) Close() {
	if l.timer != nil {
		l.timer.Stop()
	}
	if l.stopWatch != nil {
		l.stopWatch()
	}
	if l.conn != nil {
		l.unpin()
	}
}

// backendPID returns the server process of conn, asked once per connection
// and kept, so that a statement on it can be cancelled from another one.
func (in *Inbox) backendPID(ctx context.Context, conn *sqlx.Conn) (int, error) {
	var key any
	conn.Raw(func(dc any) error { key = dc; return nil })
	if pid, ok := in.pids.Load(key); ok {
		return pid.(int), nil
	}
	var pid int
	if err := conn.QueryRowxContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return 0, fmt.Errorf("read backend pid: %w", err)
	}
	if in.npids.Load() >= int64(64+2*in.db.Stats().MaxOpenConnections) {
		// Closed connections leave their entries behind; starting over
		// bounds the map at the cost of asking each open connection again.
		in.mu.Lock()
		in.pids.Clear()
		in.npids.Store(0)
		in.mu.Unlock()
	}
	if _, loaded := in.pids.LoadOrStore(key, pid); !loaded {
		in.npids.Add(1)
	}
	return pid, nil
}

// cancelBackend asks the server, over another connection, to cancel what
// pid is running; like lib/pq's own cancel request it is best effort.
func (in *Inbox) cancelBackend(pid int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	in.db.ExecContext(ctx, `SELECT pg_cancel_backend($1)`, pid)
}

// statement prepares the apply_event call the first time it is needed. A
// failure is not kept: the next event tries again.
func (in *Inbox) statement(ctx context.Context) (*sqlx.Stmt, error) {
	if stmt := in.apply.Load(); stmt != nil {
		return stmt, nil
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if stmt := in.apply.Load(); stmt != nil {
		return stmt, nil
	}
	stmt, err := in.db.PreparexContext(ctx, `SELECT apply_event($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`)
	if err != nil {
		return nil, errors.Join(errors.New("prepare apply_event"), err)
	}
	in.apply.Store(stmt)
	return stmt, nil
}

// jsonb passes JSON bytes as a jsonb parameter: as text, or NULL when there
// are none (a []byte would be sent as bytea).
func jsonb(b []byte) *string {
	if b == nil {
		return nil
	}
	s := string(b)
	return &s
}
