package integration

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// panickyDB opens a pool on dsn whose driver is lib/pq's, except that the
// service's statement (apply_event or apply_batch) panics when it names an
// event that target says must panic (in its first argument, or, as the
// lane sends it, in its text). The panic comes as the lane reads the
// answer (inside the Scan, where database/sql lets go of its locks as it
// unwinds): the lane's attempt is one statement that is its own
// transaction, so by then it has committed. insideSQL panics in the
// driver's query call instead (database/sql then never gives the
// connection back). hits counts the panics.
func panickyDB(dsn string, maxConns int, target func(arg string) bool, insideSQL bool, hits *atomic.Int64) (*sqlx.DB, error) {
	inner, err := pq.NewConnector(dsn)
	if err != nil {
		return nil, err
	}
	d := sqlx.NewDb(sql.OpenDB(&panicConnector{inner: inner, target: target, insideSQL: insideSQL, hits: hits}), "postgres")
	d.SetMaxOpenConns(maxConns)
	d.SetMaxIdleConns(maxConns)
	return d, nil
}

// transactionPanic is what the statement panics with.
type transactionPanic struct{ arg string }

func (p transactionPanic) String() string { return "panic inside the transaction, on " + p.arg }

type panicConnector struct {
	inner     driver.Connector
	target    func(arg string) bool
	insideSQL bool
	hits      *atomic.Int64
}

func (c *panicConnector) Connect(ctx context.Context) (driver.Conn, error) {
	cn, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &panicConn{inner: cn, c: c}, nil
}

func (c *panicConnector) Driver() driver.Driver { return c.inner.Driver() }

// panicConn forwards to lib/pq's connection every interface database/sql
// looks for.
type panicConn struct {
	inner driver.Conn
	c     *panicConnector
}

func (cn *panicConn) Prepare(query string) (driver.Stmt, error) {
	return cn.PrepareContext(context.Background(), query)
}

func (cn *panicConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	st, err := cn.inner.(driver.ConnPrepareContext).PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return &panicStmt{inner: st, query: query, c: cn.c}, nil
}

func (cn *panicConn) Close() error { return cn.inner.Close() }

func (cn *panicConn) Begin() (driver.Tx, error) {
	return cn.BeginTx(context.Background(), driver.TxOptions{})
}

func (cn *panicConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return cn.inner.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func (cn *panicConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	rows, err := cn.inner.(driver.QueryerContext).QueryContext(ctx, query, args)
	if err != nil {
		return nil, err
	}
	return cn.c.arm(query, args, rows), nil
}

func (cn *panicConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return cn.inner.(driver.ExecerContext).ExecContext(ctx, query, args)
}

func (cn *panicConn) Ping(ctx context.Context) error { return cn.inner.(driver.Pinger).Ping(ctx) }

func (cn *panicConn) ResetSession(ctx context.Context) error {
	return cn.inner.(driver.SessionResetter).ResetSession(ctx)
}

func (cn *panicConn) IsValid() bool { return cn.inner.(driver.Validator).IsValid() }

func (cn *panicConn) CheckNamedValue(nv *driver.NamedValue) error {
	return cn.inner.(driver.NamedValueChecker).CheckNamedValue(nv)
}

type panicStmt struct {
	inner driver.Stmt
	query string
	c     *panicConnector
}

func (st *panicStmt) Close() error  { return st.inner.Close() }
func (st *panicStmt) NumInput() int { return st.inner.NumInput() }

func (st *panicStmt) Exec(args []driver.Value) (driver.Result, error) {
	return st.inner.Exec(args) //lint:ignore SA1019 database/sql calls the context form
}

func (st *panicStmt) Query(args []driver.Value) (driver.Rows, error) {
	return st.inner.Query(args) //lint:ignore SA1019 database/sql calls the context form
}

func (st *panicStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return st.inner.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (st *panicStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	rows, err := st.inner.(driver.StmtQueryContext).QueryContext(ctx, args)
	if err != nil {
		return nil, err
	}
	return st.c.arm(st.query, args, rows), nil
}

// arm returns rows, or, for the service's statement on a target event,
// panics now (insideSQL: the statement ran, its answer is unread) or
// returns rows that panic once the answer is read.
func (c *panicConnector) arm(query string, args []driver.NamedValue, rows driver.Rows) driver.Rows {
	if !strings.Contains(query, "apply_event(") && !strings.Contains(query, "apply_batch(") {
		return rows
	}
	arg := query // the lane writes its arguments into its statement
	if len(args) > 0 {
		arg = fmt.Sprint(args[0].Value)
	}
	if !c.target(arg) {
		return rows
	}
	if len(arg) > 80 {
		arg = arg[:80] + "…"
	}
	if c.insideSQL {
		c.hits.Add(1)
		panic(transactionPanic{arg})
	}
	return &panicRows{Rows: rows, c: c, arg: arg}
}

type panicRows struct {
	driver.Rows
	c   *panicConnector
	arg string
}

func (r *panicRows) Next(dest []driver.Value) error {
	if err := r.Rows.Next(dest); err != nil {
		return err
	}
	r.c.hits.Add(1)
	panic(transactionPanic{r.arg})
}
