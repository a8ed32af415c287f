package db

import (
	"context"
	"database/sql/driver"
	"errors"
	"strings"
	"sync/atomic"

	"github.com/lib/pq"
)

// conn is lib/pq's connection as the pool holds it, with what a failover
// needs:
//
//   - once its server answers that it is read-only (a hot standby, or a
//     primary demoted behind a stale address), the connection is not used
//     again: the pool closes it when it comes back (IsValid), and the next
//     attempt opens a new one, which target_session_attrs=read-write sends
//     to the new primary. The error itself goes up unchanged: a transient
//     one, retried in place (adr/0002). A server that is gone is lib/pq's
//     own case: it marks the connection bad on a broken socket.
//   - with a ReplicationWatch that refuses (REQUIRE_SYNC_STANDBY and no
//     synchronous standby), every transaction is refused before it begins
//     (admit).
type conn struct {
	pc      driver.Conn // lib/pq's
	watch   *ReplicationWatch
	stale   atomic.Bool // its server said it is read-only
	refused atomic.Bool // a transaction was refused on it

	// The session's statement_timeout in ms, once a lane has read it
	// (timeoutRead); only whoever holds the connection touches them.
	timeoutRead bool
	timeoutMS   int64
}

// Every interface lib/pq's connection implements, so that database/sql
// uses the wrapper as it would lib/pq's.
var (
	_ driver.ConnBeginTx         = (*conn)(nil)
	_ driver.ConnPrepareContext  = (*conn)(nil)
	_ driver.ExecerContext       = (*conn)(nil)
	_ driver.QueryerContext      = (*conn)(nil)
	_ driver.Pinger              = (*conn)(nil)
	_ driver.SessionResetter     = (*conn)(nil)
	_ driver.Validator           = (*conn)(nil)
	_ driver.NamedValueChecker   = (*conn)(nil)
	_ interface{ Close() error } = (*conn)(nil)
)

// isReadOnly reports whether err says the server is read-only: 25006
// (read_only_sql_transaction), or 0A000 for what a server in recovery
// cannot do ("cannot execute … during recovery").
func isReadOnly(err error) bool {
	var pqErr *pq.Error
	if !errors.As(err, &pqErr) {
		return false
	}
	return pqErr.Code == "25006" ||
		pqErr.Code == "0A000" && (strings.Contains(pqErr.Message, "recovery") || strings.Contains(pqErr.Message, "read-only"))
}

// seen marks the connection stale when err says its server is read-only,
// and returns err.
func (c *conn) seen(err error) error {
	if err != nil && isReadOnly(err) {
		c.stale.Store(true)
	}
	return err
}

func (c *conn) Prepare(query string) (driver.Stmt, error) {
	st, err := c.pc.Prepare(query)
	return st, c.seen(err)
}

func (c *conn) Close() error { return c.pc.Close() }

func (c *conn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

// admit returns the watch's refusal of a transaction on c, if it refuses
// one now, and then has the pool close c when it comes back: it is checked
// again, on a new connection, when the refusal ends. BeginTx asks it, and
// so does a lane before each attempt, which needs no BEGIN.
func (c *conn) admit() error {
	if err := c.watch.refusal(); err != nil {
		c.refused.Store(true)
		return err
	}
	return nil
}

func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if err := c.admit(); err != nil {
		return nil, err
	}
	tx, err := c.pc.(driver.ConnBeginTx).BeginTx(ctx, opts)
	return tx, c.seen(err)
}

func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	st, err := c.pc.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	return st, c.seen(err)
}

func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	r, err := c.pc.(driver.ExecerContext).ExecContext(ctx, query, args)
	return r, c.seen(err)
}

func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	r, err := c.pc.(driver.QueryerContext).QueryContext(ctx, query, args)
	return r, c.seen(err)
}

func (c *conn) Ping(ctx context.Context) error {
	return c.seen(c.pc.(driver.Pinger).Ping(ctx))
}

func (c *conn) ResetSession(ctx context.Context) error {
	if !c.IsValid() {
		return driver.ErrBadConn
	}
	return c.pc.(driver.SessionResetter).ResetSession(ctx)
}

// IsValid is false for a connection whose server said it is read-only, or
// that a refusal met: the pool closes it rather than keep it.
func (c *conn) IsValid() bool {
	return !c.stale.Load() && !c.refused.Load() && c.pc.(driver.Validator).IsValid()
}

func (c *conn) CheckNamedValue(nv *driver.NamedValue) error {
	return c.pc.(driver.NamedValueChecker).CheckNamedValue(nv)
}
