// Package db is the PostgreSQL side of the service: opening the database,
// migrating its schema, and applying an event in one local transaction. It is
// the only package that knows lib/pq's errors; it hands the consumer the
// project's own failure classes.
package db

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
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

// Option changes how a pool's connections are made.
type Option func(*connector)

// WatchReplication reads the server's synchronous replication settings on
// every new connection into w, and has every transaction refused while w
// refuses.
func WatchReplication(w *ReplicationWatch) Option { return func(c *connector) { c.watch = w } }

// OnConnect has f called after each new connection is made, so at start
// and at every reconnect, a failover's included. f must not block.
func OnConnect(f func()) Option { return func(c *connector) { c.connected = append(c.connected, f) } }

// OpenFrom is Open with the URL asked of src for each new connection. The
// URL may be either of libpq's forms, with one host or several (ParseDSN).
func OpenFrom(ctx context.Context, src Source, maxConns int, opts ...Option) (*sqlx.DB, error) {
	c := &connector{src: src}
	for _, o := range opts {
		o(c)
	}
	db := sqlx.NewDb(sql.OpenDB(c), "postgres")
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
// time the pool opens a connection, and gives lib/pq the URL's keyword
// form, which lib/pq reads right for several hosts too.
type connector struct {
	src   Source
	watch *ReplicationWatch // nil: none
	dial  pq.Dialer         // nil: sockets (tests count what goes through theirs)
	// connected are called after each new connection (OnConnect).
	connected []func()
}

func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	raw, err := c.src()
	if err != nil {
		return nil, err
	}
	dsn, err := ParseDSN(raw)
	if err != nil {
		return nil, fmt.Errorf("the database URL does not parse%s", parseReason(err))
	}
	pc, err := pq.NewConnector(dsn.Driver())
	if err != nil {
		return nil, fmt.Errorf("lib/pq does not accept the database URL%s", reasonWithoutSecret(err, raw))
	}
	if c.dial != nil {
		pc.Dialer(c.dial)
	} else {
		pc.Dialer(&sockets)
	}
	dc, err := pc.Connect(ctx)
	if err != nil {
		return nil, err
	}
	if err := c.watch.readOnConnect(ctx, dc); err != nil {
		dc.Close()
		return nil, err
	}
	for _, f := range c.connected {
		f()
	}
	return &conn{pc: dc, watch: c.watch}, nil
}

// parseReason returns ": " and the reason of ParseDSN's err, unless it is
// url.Parse's, which may quote a piece of a password that broke the URL.
func parseReason(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ""
	}
	return ": " + err.Error()
}

func (*connector) Driver() driver.Driver { return &pq.Driver{} }

// reasonWithoutSecret returns ": " and err's text, when it holds no
// secret of raw, a connection setting in either form; else nothing.
// lib/pq's parse errors may quote the setting it could not read.
func reasonWithoutSecret(err error, raw string) string {
	dsn, perr := ParseDSN(raw)
	if perr != nil {
		return "" // no telling which part is secret
	}
	var secrets []string
	for _, p := range dsn.secrets() {
		secrets = append(secrets, p, url.QueryEscape(p), url.PathEscape(p), valueQuoter.Replace(p))
	}
	msg := err.Error()
	for _, s := range secrets {
		if s != "" && strings.Contains(msg, s) {
			return ""
		}
	}
	return ": " + msg
}
