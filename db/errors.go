package db

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"transferconsumer/consumer"
)

// transitionCode is the SQLSTATE apply_event raises for a lifecycle event
// that contradicts its transfer (sql/0004_apply_event.sql).
const transitionCode = "TC001"

// translate puts a driver error into the project's failure classes, once,
// here. Transition: apply_event refused a contradicting lifecycle event.
// Transient: the database cannot be reached or asks for a retry. Everything
// else is returned as is, which the consumer treats as unknown.
func translate(err error) error {
	var pqErr *pq.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pqErr) && pqErr.Code == transitionCode:
		return consumer.Transition(errors.New(pqErr.Message))
	case isTransient(err):
		return consumer.Transient(err)
	}
	return err
}

func isTransient(err error) bool {
	var pqErr *pq.Error
	if errors.As(err, &pqErr) {
		switch pqErr.Code.Class() {
		case "08", // connection exception
			"40", // transaction rollback: 40001 serialization, 40P01 deadlock
			"53", // insufficient resources: too many connections, disk full
			"57": // operator intervention: admin shutdown, crash shutdown, cannot connect now
			return true
		}
		return false
	}
	var netErr net.Error
	switch {
	case errors.Is(err, driver.ErrBadConn),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE),
		errors.Is(err, context.DeadlineExceeded), // one attempt timed out
		errors.As(err, &netErr):
		return true
	}
	return false
}

// inTx runs fn in a transaction and commits it, or rolls it back and returns
// fn's error joined with any rollback error.
func inTx(ctx context.Context, db interface {
	BeginTxx(context.Context, *sql.TxOptions) (*sqlx.Tx, error)
}, fn func(*sqlx.Tx) error) error {
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
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
