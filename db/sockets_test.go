package db

import (
	"context"
	"testing"
	"time"
)

// A query that its context ends is cancelled through a cancel request of
// its own, on a socket the pool's dialer opened and counts: once the pool
// is closed, waiting for the sockets waits for that request too, and then
// none is open.
func TestWaitingForSocketsWaitsForCancelRequests(t *testing.T) {
	url := testDBURL(t)
	d := &trackingDialer{}
	database, err := OpenFrom(context.Background(), func() (string, error) { return url, nil }, 2,
		func(c *connector) { c.dial = d })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, err = database.ExecContext(ctx, `SELECT pg_sleep(30)`)
	cancel()
	if err == nil {
		t.Fatal("the query outlived its context")
	}
	database.Close()
	if !d.wait(10 * time.Second) {
		t.Fatalf("%d sockets still open 10 s after the pool closed", d.open.Load())
	}
	if n := d.dials.Load(); n < 2 {
		t.Errorf("%d sockets dialled, want the connection and its cancel request", n)
	}
}
