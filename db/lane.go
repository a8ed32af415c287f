package db

import (
	"context"
	"database/sql/driver"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
)

// A lane is one worker's connection to the database: it keeps its
// connection between events (pin, unpin), sends each attempt as one Query
// message (run), and closes the connection underneath an attempt whose
// context ends (watch, abort, discard). Inbox.Lane makes one; apply.go
// holds what a lane applies.
type lane struct {
	in      *Inbox
	timeout time.Duration

	head    string // prologue's text for conn
	conn    *sqlx.Conn
	watched context.Context // the context whose end closes conn (watch)
	unwatch func() bool

	// mu guards what abort, run from another goroutine, touches.
	mu      sync.Mutex
	raw     io.Closer // conn's driver connection, closed directly by abort and discard
	pc      *conn     // the same, as the pool's wrapper (admit); nil for another driver's
	aborted bool      // the watched context ended: conn was closed underneath
	gen     uint64    // counts the contexts watched, so that an old one's abort does nothing

	// beforeSend, when set (by tests), runs in each attempt once its
	// statement is written, before a connection is taken.
	beforeSend func()
}

// run applies one attempt on the lane's connection: the function call that
// call writes, its one value scanned into dest. The attempt is one Query message
// and its answer, one round trip (adr/0005, "One round trip"):
//
//	SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE;
//	SET LOCAL statement_timeout = <the lane's timeout, in ms>;
//	SELECT fn(<args, as literals>)
//
// PostgreSQL runs the three statements of one Query message as one
// transaction and commits it after the last, and it disarms
// statement_timeout before that commit: the timeout bounds the work, never
// the commit's wait for a synchronous standby, which no cancel may cut
// short (a cancelled wait reports success for a commit that is only
// local). Nothing of it outlives the transaction on the server, so it
// works the same behind PgBouncer in transaction mode.
//
// The statement runs under no context, so neither lib/pq nor database/sql
// starts a goroutine to watch it. When ctx ends (the worker's shutdown), the
// lane closes its connection instead (watch): the attempt fails, unacked,
// and its message goes back to the queue; a commit under way completes on
// the server or not at all, and the inbox absorbs the redelivery either way.
func (l *lane) run(ctx context.Context, call func(*strings.Builder) error, dest any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.watch(ctx)
	if l.conn == nil {
		if err := l.pin(ctx); err != nil {
			return err
		}
	}
	var q strings.Builder
	q.Grow(1024) // an event's statement, written without growing
	q.WriteString(l.head)
	if err := call(&q); err != nil {
		return err
	}
	if l.beforeSend != nil {
		l.beforeSend()
	}
	if l.pc != nil {
		if err := l.pc.admit(); err != nil {
			l.unpin()
			return err
		}
	}
	finished := false
	defer func() {
		if !finished {
			// A panic inside database/sql or the driver, which may keep
			// the connection taken for good: the connection goes.
			l.discard()
		}
	}()
	err := l.conn.QueryRowContext(context.Background(), q.String()).Scan(dest)
	finished = true
	switch {
	case err != nil:
		// A fresh connection is simpler to trust than one that failed.
		l.unpin()
	case !l.in.keepConns():
		l.unpin()
	}
	return err
}

// prologue returns what each attempt on a connection sends before its
// call: the transaction's isolation and its statement_timeout, the lane's
// timeout or the session's own statement_timeout (sessionMS, the role's or
// database's setting), whichever is shorter: the service never loosens a
// bound an operator set.
func (l *lane) prologue(sessionMS int64) string {
	head := "SET TRANSACTION ISOLATION LEVEL READ COMMITTED, READ WRITE; "
	ms := l.timeout.Milliseconds()
	if l.timeout > 0 {
		ms = max(ms, 1)
	}
	if sessionMS > 0 && (ms == 0 || sessionMS < ms) {
		ms = sessionMS
	}
	if ms > 0 {
		head += "SET LOCAL statement_timeout = " + strconv.FormatInt(ms, 10) + "; "
	}
	return head
}

// watch makes sure that the end of ctx closes the lane's connection, with
// one context.AfterFunc for each context the lane is given (the worker
// gives the same one every time), not one per attempt. A lane given
// another context after the last one ended starts again on a new
// connection.
func (l *lane) watch(ctx context.Context) {
	if ctx == l.watched {
		return
	}
	if l.unwatch != nil {
		l.unwatch()
	}
	l.mu.Lock()
	l.gen++
	gen, aborted := l.gen, l.aborted
	l.mu.Unlock()
	if aborted && l.conn != nil {
		l.unpin() // closed underneath: for good
	}
	l.mu.Lock()
	l.aborted = false
	l.mu.Unlock()
	l.watched, l.unwatch = ctx, context.AfterFunc(ctx, func() { l.abort(gen) })
}

// abort closes the connection under the attempt running on it, if any:
// lib/pq's read returns an error at once. The connection is never used
// again (unpin). An abort for a context the lane no longer watches (gen)
// does nothing.
func (l *lane) abort(gen uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if gen != l.gen {
		return
	}
	l.aborted = true
	if l.raw != nil {
		l.raw.Close()
	}
}

// pin takes a connection for the lane, within the lane's timeout.
func (l *lane) pin(ctx context.Context) error {
	if l.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.timeout)
		defer cancel()
	}
	c, err := l.in.db.Connx(ctx)
	if err != nil {
		return err
	}
	var raw io.Closer
	var pc *conn
	c.Raw(func(dc any) error {
		raw, _ = dc.(io.Closer)
		pc, _ = dc.(*conn)
		return nil
	})
	// The session's own statement_timeout, read once per physical
	// connection (a lane that gives its connection back after each event
	// does not ask again): behind PgBouncer each transaction may run on
	// another server connection, but all of them are the same role's on the
	// same database.
	var sessionMS int64
	if pc == nil || !pc.timeoutRead {
		if err := c.QueryRowxContext(ctx, `SELECT (extract(epoch FROM current_setting('statement_timeout')::interval) * 1000)::bigint`).Scan(&sessionMS); err != nil {
			c.Close()
			return err
		}
		if pc != nil {
			pc.timeoutRead, pc.timeoutMS = true, sessionMS
		}
	} else {
		sessionMS = pc.timeoutMS
	}
	l.head = l.prologue(sessionMS)
	l.in.pinned.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.raw, l.pc, l.conn = raw, pc, c
	if l.aborted && l.raw != nil {
		// ctx ended while the connection was taken: abort found none.
		l.raw.Close()
	}
	return nil
}

// unpin gives the lane's connection back: to the pool, or, when abort
// closed it underneath, to be closed for good.
func (l *lane) unpin() {
	l.mu.Lock()
	conn, aborted := l.conn, l.aborted
	l.conn, l.raw, l.pc = nil, nil, nil
	l.mu.Unlock()
	l.in.pinned.Add(-1)
	if aborted {
		conn.Raw(func(any) error { return driver.ErrBadConn }) // the pool closes it
	}
	conn.Close()
}

// Close returns the lane's connection to the pool; the lane is not used
// again. A second Close does nothing.
func (l *lane) Close() {
	if l.unwatch != nil {
		l.unwatch()
		l.unwatch, l.watched = nil, nil
	}
	if l.conn != nil {
		l.unpin()
	}
}

// discard drops the lane's connection after a panic in its transaction,
// which inTx rolled back, unless the panic came from inside database/sql:
// then database/sql never gives the connection back, and closing it waits
// forever. So it is closed (not returned to the pool) in the background,
// and if that has not happened within rollbackWait, the driver's connection
// is closed underneath database/sql, whose lock on it will never be
// released anyway: the server (or PgBouncer, for a client that leaves in a
// transaction) then ends the transaction and releases what it held.
func (l *lane) discard() {
	l.mu.Lock()
	conn, raw := l.conn, l.raw
	l.conn, l.raw, l.pc = nil, nil, nil
	l.mu.Unlock()
	if conn == nil {
		return
	}
	l.in.pinned.Add(-1)
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
		if raw != nil {
			raw.Close()
		}
	}
}
