package db

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// sockets is the dialer of every pool OpenFrom makes. It counts the
// sockets to PostgreSQL (or to a pooler in front of it) that are open,
// lib/pq's cancel requests included: lib/pq dials those through the pool's
// dialer too.
var sockets trackingDialer

// trackingDialer is a net.Dialer (lib/pq's own default) that counts what
// it opened until it is closed.
type trackingDialer struct {
	d     net.Dialer
	open  atomic.Int64
	dials atomic.Int64
}

func (t *trackingDialer) Dial(network, address string) (net.Conn, error) {
	return t.DialContext(context.Background(), network, address)
}

func (t *trackingDialer) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return t.DialContext(ctx, network, address)
}

func (t *trackingDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	c, err := t.d.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	t.dials.Add(1)
	t.open.Add(1)
	return &trackedConn{Conn: c, open: &t.open}, nil
}

type trackedConn struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}

// WaitForSockets waits, at most timeout, until every socket of the pools'
// is closed, and reports whether they all were. The process
// calls it before it exits, once its pools are closed: a query cancelled
// at shutdown (its context ended) returns as soon as the server answers,
// while lib/pq's cancel request, sent from a goroutine of its own, may
// still be open. Cut off by the exit, that request crashes PgBouncer 1.18
// (pgbouncer/pgbouncer#801: "FATAL … disconnect_client(): bad client
// state: 0"), and every client of that pooler with it.
func WaitForSockets(timeout time.Duration) bool { return sockets.wait(timeout) }

func (t *trackingDialer) wait(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for t.open.Load() > 0 {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}
