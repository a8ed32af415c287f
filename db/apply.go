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
// states, each exactly once in effect. It implements consumer.Applier.
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
// failure, deadlock); any other error as is.
func (in *Inbox) Apply(ctx context.Context, ev consumer.Event) (consumer.Result, error) {
	stmt, err := in.statement(ctx)
	if err != nil {
		return consumer.Result{}, fmt.Errorf("apply event %s: %w", ev.ID, translate(err))
	}
	conn, err := in.db.Connx(ctx)
	if err != nil {
		return consumer.Result{}, fmt.Errorf("apply event %s: %w", ev.ID, translate(err))
	}
	defer conn.Close()
	pid, err := in.backendPID(ctx, conn)
	if err != nil {
		return consumer.Result{}, fmt.Errorf("apply event %s: %w", ev.ID, translate(err))
	}
	// The statements run under a context that is never cancelled, and one
	// callback armed on ctx cancels them on the server instead: given a
	// cancellable context, database/sql and lib/pq start a goroutine per
	// statement to watch it, three per event, which cost about 40 µs of CPU
	// per event here (BENCHMARKS.md). What a cancel interrupts rolls back;
	// the error is transient, so the event is retried in place.
	cancelled := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(cancelled)
		in.cancelBackend(pid)
	})
	t := ev.Transfer
	var outcome string
	quiet := context.Background()
	err = inTx(quiet, conn, func(tx *sqlx.Tx) error {
		return tx.StmtContext(quiet, stmt.Stmt).QueryRowContext(quiet,
			ev.ID, ev.Type, ev.Fingerprint, t.ID, t.FromAccount, t.ToAccount, t.AmountMinor, t.Currency).Scan(&outcome)
	})
	if !stop() {
		// The cancel was sent, and may yet reach the server after this
		// transaction ended: the connection must not run anyone's next
		// statement, so it is discarded rather than returned to the pool.
		<-cancelled
		// If the transaction committed before the cancel took effect, err
		// is nil and the event is applied.
		conn.Raw(func(any) error { return driver.ErrBadConn })
	}
	if err != nil {
		return consumer.Result{}, fmt.Errorf("apply event %s: %w", ev.ID, translate(err))
	}
	switch {
	case outcome == "applied":
		return consumer.Result{}, nil
	case outcome == "duplicate":
		return consumer.Result{Duplicate: true}, nil
	case strings.HasPrefix(outcome, "conflict:"):
		return consumer.Result{}, consumer.Conflict(fmt.Errorf(
			"producer conflict: event %s was applied with content fingerprint %s, this delivery has %x",
			ev.ID, strings.TrimPrefix(outcome, "conflict:"), ev.Fingerprint))
	}
	return consumer.Result{}, fmt.Errorf("apply event %s: unexpected outcome %q", ev.ID, outcome)
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
	stmt, err := in.db.PreparexContext(ctx, `SELECT apply_event($1, $2, $3, $4, $5, $6, $7, $8)`)
	if err != nil {
		return nil, errors.Join(errors.New("prepare apply_event"), err)
	}
	in.apply.Store(stmt)
	return stmt, nil
}
