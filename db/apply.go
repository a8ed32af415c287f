package db

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"transferconsumer/consumer"
)

// Inbox applies events to the balance projection and the transfers'
// states, each exactly once in effect. It implements consumer.Applier and
// consumer.Lanes.
type Inbox struct {
	db *sqlx.DB

	mu    sync.Mutex                // held to prepare statements and to reset pids
	apply atomic.Pointer[sqlx.Stmt] // apply_event, prepared once, re-prepared by database/sql per connection
	batch atomic.Pointer[sqlx.Stmt] // apply_batch, likewise
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

	// inTransaction, when set (by tests), runs in each transaction after
	// its statement, before the commit: where a panic holds the claims
	// and locks the statement took.
	inTransaction func()

	mu        sync.Mutex // guards what the timer and the watch touch
	pid       int        // conn's server process
	active    bool       // a transaction is running on conn
	deadline  time.Time  // of the running attempt, when timeout > 0
	cancelled bool       // a cancel was sent for conn
}

func (l *lane) Apply(ctx context.Context, ev consumer.Event) (consumer.Result, error) {
	var outcome string
	if err := l.run(ctx, &l.in.apply, applyEventSQL, eventArgs(ev), &outcome); err != nil {
		return consumer.Result{}, fmt.Errorf("apply event %s: %w", ev.ID, translate(err))
	}
	o := result(ev, outcome)
	return o.Result, o.Err
}

// ApplyBatch applies evs in one transaction: one call of apply_batch
// (sql/0007), which claims them all in one statement and applies their
// effects in order. It returns one outcome per event, as Apply would have
// (a duplicate, or a producer conflict for that event alone); an error
// means nothing of the batch was committed, classified as Apply's are: a
// transition that contradicts its transfer or data the database refuses
// is then one of the events, which the caller finds by splitting the
// batch. It implements consumer.BatchLane.
func (l *lane) ApplyBatch(ctx context.Context, evs []consumer.Event) ([]consumer.Outcome, error) {
	var outcomes pq.StringArray
	if err := l.run(ctx, &l.in.batch, applyBatchSQL, batchArgs(evs), &outcomes); err != nil {
		return nil, fmt.Errorf("apply a batch of %d events from %s: %w", len(evs), evs[0].ID, translate(err))
	}
	if len(outcomes) != len(evs) {
		return nil, fmt.Errorf("apply_batch answered %d outcomes for %d events", len(outcomes), len(evs))
	}
	out := make([]consumer.Outcome, len(evs))
	for i, ev := range evs {
		out[i] = result(ev, outcomes[i])
	}
	return out, nil
}

// result reads apply_event's answer for ev.
func result(ev consumer.Event, outcome string) consumer.Outcome {
	switch {
	case outcome == "applied":
		return consumer.Outcome{}
	case outcome == "applied+outbox":
		return consumer.Outcome{Result: consumer.Result{Outbox: true}}
	case outcome == "duplicate":
		return consumer.Outcome{Result: consumer.Result{Duplicate: true}}
	case strings.HasPrefix(outcome, "conflict:"):
		return consumer.Outcome{Err: consumer.Conflict(fmt.Errorf(
			"producer conflict: event %s was applied with content fingerprint %s, this delivery has %x",
			ev.ID, strings.TrimPrefix(outcome, "conflict:"), ev.Fingerprint))}
	}
	return consumer.Outcome{Err: fmt.Errorf("apply event %s: unexpected outcome %q", ev.ID, outcome)}
}

const (
	applyEventSQL = `SELECT apply_event($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`
	applyBatchSQL = `SELECT apply_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`
)

// message is what a transition keeps of its delivery, in case it waits for
// its creation and then contradicts it (sql/0006); a creation never needs
// it, and passes NULLs.
type message struct {
	key, id, contentType sql.NullString
	body, headers        []byte
}

func messageOf(ev consumer.Event) message {
	if ev.Type == consumer.EventTransferCreated {
		return message{}
	}
	m := ev.Message
	return message{
		key: valid(storableText(m.RoutingKey)), id: valid(m.MessageID), contentType: valid(storableText(m.ContentType)),
		body: m.Body, headers: storableHeaders(consumer.HeadersJSON(m.Headers)),
	}
}

func valid(s string) sql.NullString { return sql.NullString{String: s, Valid: true} }

// eventArgs are apply_event's arguments for ev.
func eventArgs(ev consumer.Event) []any {
	t, m := ev.Transfer, messageOf(ev)
	return []any{ev.ID, ev.Type, ev.Fingerprint, t.ID, t.FromAccount, t.ToAccount, t.AmountMinor, t.Currency,
		m.key, m.body, jsonb(m.headers), m.id, m.contentType}
}

// batchArgs are apply_batch's arguments for evs: one array per column.
func batchArgs(evs []consumer.Event) []any {
	n := len(evs)
	var (
		ids, types, transfers, froms, tos, currencies = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		fingerprints, bodies                          = make([][]byte, n), make([][]byte, n)
		amounts                                       = make([]int64, n)
		keys, headers, msgIDs, contentTypes           = make([]sql.NullString, n), make([]sql.NullString, n), make([]sql.NullString, n), make([]sql.NullString, n)
	)
	for i, ev := range evs {
		t, m := ev.Transfer, messageOf(ev)
		ids[i], types[i], fingerprints[i], transfers[i] = ev.ID, ev.Type, ev.Fingerprint, t.ID
		froms[i], tos[i], amounts[i], currencies[i] = t.FromAccount, t.ToAccount, t.AmountMinor, t.Currency
		keys[i], bodies[i], msgIDs[i], contentTypes[i] = m.key, m.body, m.id, m.contentType
		if m.headers != nil {
			headers[i] = valid(string(m.headers))
		}
	}
	return []any{pq.Array(ids), pq.Array(types), pq.ByteaArray(fingerprints), pq.Array(transfers),
		pq.Array(froms), pq.Array(tos), pq.Array(amounts), pq.Array(currencies),
		pq.Array(keys), pq.ByteaArray(bodies), pq.Array(headers), pq.Array(msgIDs), pq.Array(contentTypes)}
}

// run runs one transaction on the lane's connection: the statement query
// (prepared once, kept in stmt) with args, its one value scanned into dest.
func (l *lane) run(ctx context.Context, stmt *atomic.Pointer[sqlx.Stmt], query string, args []any, dest any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	prepared, err := l.in.statement(ctx, stmt, query)
	if err != nil {
		return err
	}
	if l.conn == nil {
		if err := l.pin(ctx); err != nil {
			return err
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

	var cancelled, ended bool
	end := func() {
		if !ended {
			ended, cancelled = true, l.end()
		}
	}
	finished := false
	defer func() {
		if !finished {
			// The transaction panicked, and inTx rolled it back as far as
			// it could: nothing of the attempt may outlive it, no cancel
			// may start any more, and the connection goes.
			end()
			l.discard()
		}
	}()
	quiet := context.Background()
	err = inTx(quiet, l.conn, func(tx *sqlx.Tx) error {
		if err := tx.StmtContext(quiet, prepared.Stmt).QueryRowContext(quiet, args...).Scan(dest); err != nil {
			return err
		}
		if l.inTransaction != nil {
			l.inTransaction()
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
	finished = true
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
	return err
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

// discard drops the lane's connection after a panic in its transaction,
// which inTx rolled back, unless the panic came from inside database/sql:
// then database/sql never gives the connection back, and closing it waits
// forever. So it is closed (not returned to the pool) in the background,
// and if that has not happened within rollbackWait, its server process is
// terminated, which ends the transaction and releases what it held.
func (l *lane) discard() {
	conn, pid := l.conn, l.pid
	l.conn = nil
	if conn == nil {
		return
	}
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		conn.Raw(func(any) error { return driver.ErrBadConn }) // the pool closes it
		conn.Close()
	}()
	t := time.NewTimer(rollbackWait)
	defer t.Stop()
	select {
	case <-closed:
	case <-t.C:
		l.in.terminateBackend(pid)
	}
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

// terminateBackend ends the server process pid, over another connection,
// and with it the transaction it is in; best effort, like cancelBackend.
func (in *Inbox) terminateBackend(pid int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	in.db.ExecContext(ctx, `SELECT pg_terminate_backend($1)`, pid)
}

// statement prepares query the first time it is needed and keeps it in
// stmt. A failure is not kept: the next event tries again.
func (in *Inbox) statement(ctx context.Context, stmt *atomic.Pointer[sqlx.Stmt], query string) (*sqlx.Stmt, error) {
	if s := stmt.Load(); s != nil {
		return s, nil
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if s := stmt.Load(); s != nil {
		return s, nil
	}
	s, err := in.db.PreparexContext(ctx, query)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("prepare %s", query), err)
	}
	stmt.Store(s)
	return s, nil
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
