// Package db is the PostgreSQL side of the service: opening the database,
// migrating its schema, and applying an event in one local transaction. It is
// the only package that knows lib/pq's errors; it hands the consumer the
// project's own failure classes.
package db

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq" // also registers the "postgres" driver
)

// Open connects to url and checks the connection. maxConns bounds the pool:
// one connection per consuming queue plus a few for migrations and jobs.
func Open(ctx context.Context, url string, maxConns int) (*sqlx.DB, error) {
	return OpenFrom(ctx, func() (string, error) { return url, nil }, maxConns)
}

// Source returns the database URL to connect with. A pool calls it for
// each new connection, so a URL read from a file (a mounted secret) follows
// a rotated password without a restart. Its error must say where it looked
// and never quote the URL, which may hold the password.
type Source func() (string, error)

// OpenFrom is Open with the URL asked of src for each new connection.
func OpenFrom(ctx context.Context, src Source, maxConns int) (*sqlx.DB, error) {
	db := sqlx.NewDb(sql.OpenDB(connector{src}), "postgres")
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	db.SetConnMaxIdleTime(5 * time.Minute)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("connect to database: %w", translate(err))
	}
	return db, nil
}

// connector is a driver.Connector that asks its Source for the URL each
// time the pool opens a connection.
type connector struct{ src Source }

func (c connector) Connect(ctx context.Context) (driver.Conn, error) {
	dsn, err := c.src()
	if err != nil {
		return nil, err
	}
	pc, err := pq.NewConnector(dsn)
	if err != nil {
		return nil, fmt.Errorf("lib/pq does not accept the database URL%s", reasonWithoutSecret(err, dsn))
	}
	return pc.Connect(ctx)
}

func (connector) Driver() driver.Driver { return &pq.Driver{} }

// reasonWithoutSecret returns ": " and err's text, when it holds no
// password of dsn, a URL; else nothing. lib/pq's parse errors may quote the
// URL it could not read.
func reasonWithoutSecret(err error, dsn string) string {
	u, perr := url.Parse(dsn)
	if perr != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "" // no telling which part is secret
	}
	var secrets []string
	if p, ok := u.User.Password(); ok {
		secrets = append(secrets, p, url.QueryEscape(p), url.PathEscape(p))
	}
	for k, vs := range u.Query() {
		if strings.Contains(strings.ToLower(k), "password") {
			secrets = append(secrets, vs...)
		}
	}
	msg := err.Error()
	for _, s := range secrets {
		if s != "" && strings.Contains(msg, s) {
			return ""
		}
	}
	return ": " + msg
}
