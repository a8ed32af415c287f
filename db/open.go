package db

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"transferconsumer/consumer"
)

// OpenWhenReady opens the database at url, waiting with backoff while it is
// unreachable, and creates the database first if it does not exist. It
// returns early with the error when the failure is not transient (bad
// credentials, a missing database it may not create), and ctx's error when
// ctx ends first.
func OpenWhenReady(ctx context.Context, url string, maxConns int, b consumer.Backoff, log *slog.Logger) (*sqlx.DB, error) {
	for attempt := 0; ; attempt++ {
		db, err := Open(ctx, url, maxConns)
		if isMissingDatabase(err) {
			if cerr := createDatabase(ctx, url); cerr != nil {
				return nil, fmt.Errorf("%w; creating it failed too: %v", err, cerr)
			}
			log.Info("created database", "database", databaseName(url))
			db, err = Open(ctx, url, maxConns)
		}
		if err == nil {
			return db, nil
		}
		if consumer.ClassOf(ctx, err) != consumer.ClassTransient {
			return nil, err
		}
		delay := b.Delay(attempt)
		log.Warn("database not reachable, waiting", "err", err, "delay", delay)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
	}
}

func isMissingDatabase(err error) bool {
	var pqErr *pq.Error
	return errors.As(err, &pqErr) && pqErr.Code == "3D000" // invalid_catalog_name
}

func databaseName(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || len(u.Path) < 2 {
		return ""
	}
	return u.Path[1:]
}

// createDatabase connects to the maintenance database "postgres" on the same
// server with the same credentials and creates the database url names.
func createDatabase(ctx context.Context, raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	name := databaseName(raw)
	if name == "" {
		return errors.New("the URL names no database")
	}
	u.Path = "/postgres"
	admin, err := sqlx.Open("postgres", u.String())
	if err != nil {
		return err
	}
	defer admin.Close()
	_, err = admin.ExecContext(ctx, "CREATE DATABASE "+pq.QuoteIdentifier(name))
	var pqErr *pq.Error
	if errors.As(err, &pqErr) && pqErr.Code == "42P04" { // duplicate_database: a replica won
		return nil
	}
	return err
}
