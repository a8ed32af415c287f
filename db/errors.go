package db

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"transferconsumer/event"
)

// transitionCode is the SQLSTATE apply_event raises for a lifecycle event
// that contradicts its transfer (sql/functions/apply_effect.sql).
const transitionCode = "TC001"

// journalGapCode is the SQLSTATE journal_advance raises when the database
// does not hold the journal mark an attempt went on from
// (sql/functions/journal_advance.sql).
const journalGapCode = "TCJ01"

// translate puts a driver error into the project's failure classes, once,
// here (adr/0002). The rule is by cause, and the default is the safe side:
//
//   - TC001, raised by apply_event: the event contradicts its transfer
//     (event.Transition);
//   - TCJ01, raised by journal_advance: the database does not hold the
//     journal mark the attempt went on from (event.ErrJournalGap, an
//     environment failure: the journal's lane reads the journal again);
//   - SQLSTATE classes 22 (data exception, e.g. 22003 when a balance would
//     overflow) and 23 (integrity constraint violation): our own statement
//     refused the event's values, as it will on every attempt
//     (event.Rejected);
//   - everything else is the environment's fault (event.Transient): the
//     database unreachable, closed for maintenance (55000), read-only after a
//     failover (25006, 0A000), a rotated password or a NOLOGIN role (28P01,
//     28000), a renamed database (3D000), a revoked grant (42501), a
//     missing migration or function (42P01, 42883), lock or statement
//     timeouts (55P03, 57014), I/O errors (58030), internal errors (XX000),
//     serialization failures and deadlocks (40001, 40P01), and errors that
//     are not the server's at all (a refused or reset connection, a timed
//     out attempt). A code nobody listed falls here too: an outage must
//     never turn good events into dead letters.
func translate(err error) error {
	var pqErr *pq.Error
	if err == nil {
		return nil
	}
	if errors.As(err, &pqErr) {
		switch {
		case pqErr.Code == transitionCode:
			return event.Transition(errors.New(pqErr.Message))
		case pqErr.Code == journalGapCode:
			return event.Transient(fmt.Errorf("%w: %s", event.ErrJournalGap, pqErr.Message))
		case pqErr.Code.Class() == "22", pqErr.Code.Class() == "23":
			return event.Rejected(fmt.Errorf("the database refused the event's data: %w", err))
		}
	}
	return event.Transient(err)
}

// Translate is translate for the packages that send statements of their
// own on a pool Open made (the reconciliation): a driver error comes back
// in the project's failure classes, decided here only.
func Translate(err error) error { return translate(err) }

// readCommitted is the isolation every transaction of the service runs at,
// whatever default_transaction_isolation the database or role sets:
// apply_event takes the transfer's advisory lock and then reads the
// transfer's row, which only READ COMMITTED's fresh snapshot per statement
// makes safe (under REPEATABLE READ the row read after the lock could be
// older than the lock).
var readCommitted = &sql.TxOptions{Isolation: sql.LevelReadCommitted}

// inTx runs fn in a READ COMMITTED transaction and commits it, or rolls it
// back and returns fn's error joined with any rollback error.
//
// When fn panics (or calls runtime.Goexit), the transaction is rolled back
// on the panic's way out, and the panic goes on unchanged to the caller's
// recover. Left open, the transaction would keep its connection for good
// (closing a sql.Conn waits for its transaction, and a pool never gets the
// connection back) and its server session idle in transaction, holding the
// claims, advisory locks and row locks it took.
func inTx(ctx context.Context, db interface {
	BeginTxx(context.Context, *sql.TxOptions) (*sqlx.Tx, error)
}, fn func(*sqlx.Tx) error) error {
	tx, err := db.BeginTxx(ctx, readCommitted)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	finished := false
	defer func() {
		if !finished {
			rollbackAbandoned(tx)
		}
	}()
	err = fn(tx)
	finished = true
	if err != nil {
		if rbErr := tx.Rollback(); rbErr != nil {
			return errors.Join(err, fmt.Errorf("rollback: %w", rbErr))
		}
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// rollbackWait bounds how long a panic waits for the rollback of the
// transaction it abandoned before it goes on.
var rollbackWait = 5 * time.Second

// rollbackAbandoned rolls back a transaction whose function panicked,
// waiting at most rollbackWait. A panic inside database/sql itself (a
// driver.Valuer that panics while a statement's arguments are converted)
// leaves the transaction's connection taken for good, and Rollback then
// waits forever: the panic must reach its recover all the same, and the
// rollback goes on waiting alone. (A sql.Scanner that panics in Row.Scan
// deadlocks database/sql before any deferred call of ours runs; the service
// scans into strings and pq arrays only.)
func rollbackAbandoned(tx *sqlx.Tx) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = tx.Rollback()
	}()
	t := time.NewTimer(rollbackWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}
