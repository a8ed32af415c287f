package db

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"transferconsumer/retry"
)

// OpenWhenReady opens the database src names, creating it first if it
// does not exist and create is true (when the user may), and waits with
// backoff for as long as that fails: a database that is down, a login
// refused, a database nobody may create yet, all may heal, and the
// service's health endpoint says why it waits meanwhile. waiting, when
// set, is told each failure. It returns only an open database, or ctx's
// error when ctx ends first.
func OpenWhenReady(ctx context.Context, src Source, create bool, maxConns int, b retry.Backoff, log *slog.Logger, waiting func(error), opts ...Option) (*sqlx.DB, error) {
	var th retry.Throttle
	for attempt := 0; ; attempt++ {
		db, err := OpenFrom(ctx, src, maxConns, opts...)
		if isMissingDatabase(err) && create {
			if name, cerr := createDatabase(ctx, src); cerr != nil {
				err = fmt.Errorf("%w; creating it failed too: %v", err, cerr)
			} else {
				log.Info("created database", "database", name)
				db, err = OpenFrom(ctx, src, maxConns, opts...)
			}
		}
		if err == nil {
			return db, nil
		}
		if waiting != nil {
			waiting(err)
		}
		delay := b.Delay(attempt)
		if due, _ := th.Due(attempt+1, err.Error()); due {
			if hint := openHint(err, create); hint != "" {
				log.Error("the database refused the service, waiting", "err", err, "hint", hint,
					"attempts", attempt+1, "delay_ms", delay.Milliseconds())
			} else {
				log.Warn("database not reachable, waiting", "err", err, "attempts", attempt+1, "delay_ms", delay.Milliseconds())
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
	}
}

// openHint says what a person should check when the server answered but
// refused: a login or a database, as opposed to one that does not answer.
func openHint(err error, create bool) string {
	var pqErr *pq.Error
	if !errors.As(err, &pqErr) {
		return ""
	}
	switch pqErr.Code.Class() {
	case "28":
		return "check the user and password in DATABASE_URL, and that the role may log in"
	case "3D":
		if !create {
			return "the database does not exist, and with MIGRATE=false the service does not create it: its owner must"
		}
		return "the database does not exist and the user may not create it: create it, or give the user CREATEDB"
	case "42":
		return "check the role's privileges on the database"
	}
	return ""
}

func isMissingDatabase(err error) bool {
	var pqErr *pq.Error
	return errors.As(err, &pqErr) && pqErr.Code == "3D000" // invalid_catalog_name
}

// createDatabase connects to the maintenance database "postgres" on the
// server src names (the first of its hosts that answers as
// target_session_attrs asks), with the same credentials, and creates the
// database src names; it returns that name.
func createDatabase(ctx context.Context, src Source) (string, error) {
	raw, err := src()
	if err != nil {
		return "", err
	}
	dsn, err := ParseDSN(raw)
	if err != nil {
		return "", errors.New("the database URL does not parse")
	}
	name := dsn.Get("dbname")
	if name == "" {
		return "", errors.New("the URL names no database")
	}
	admin, err := sqlx.Open("postgres", dsn.With("dbname", "postgres").Driver())
	if err != nil {
		return "", err
	}
	defer admin.Close()
	_, err = admin.ExecContext(ctx, "CREATE DATABASE "+pq.QuoteIdentifier(name))
	var pqErr *pq.Error
	if errors.As(err, &pqErr) && pqErr.Code == "42P04" { // duplicate_database: a replica won
		return name, nil
	}
	return name, err
}
