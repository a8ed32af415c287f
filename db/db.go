// Package db is the PostgreSQL side of the service: opening the database,
// migrating its schema, and applying an event in one local transaction. It is
// the only package that knows lib/pq's errors; it hands the consumer the
// project's own failure classes.
package db

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	_ "github.com/lib/pq" // registers the "postgres" driver
)

// Open connects to url and checks the connection. maxConns bounds the pool:
// one connection per consuming queue plus a few for migrations and jobs.
func Open(ctx context.Context, url string, maxConns int) (*sqlx.DB, error) {
	db, err := sqlx.Open("postgres", url)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	db.SetConnMaxIdleTime(5 * time.Minute)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("connect to database: %w", translate(err))
	}
	return db, nil
}
