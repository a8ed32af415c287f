package db

import (
	"bytes"
	"context"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"transferconsumer/event"
)

// When the worker's context ends while an attempt is in flight (a
// shutdown), the lane closes its connection and sends no CancelRequest:
// nothing cancels the statement that carries the event's commit, which on
// the server runs on without its client and commits whole. (A COMMIT
// cancelled while it waits for a synchronous standby would report success
// for a commit that is only local: see
// integration.TestCommitWaitingForAStandbyIsNeverCancelled.)
//
// The attempt is held in flight by another transaction that claimed the
// same event first and has not ended: the lane's claim waits for it.
func TestAShutdownSendsNoCancelRequest(t *testing.T) {
	u, err := url.Parse(testDBURL(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("sslmode", "disable") // the dialer reads the cancel requests in the clear
	u.RawQuery = q.Encode()
	database, d := openCounted(t, u.String(), 4)
	ctx, shutdown := context.WithCancel(context.Background())
	defer shutdown()
	l := NewInbox(database).Lane(time.Minute).(*lane)
	defer l.Close()
	if _, err := l.Apply(ctx, newEvent(t, newID(), event.TransferCreated, newID(), "acc_w", "acc_x", 1)); err != nil {
		t.Fatal(err) // the lane takes its connection
	}
	var pid int
	var checkInterval string
	if err := l.conn.QueryRowContext(context.Background(),
		`SELECT pg_backend_pid(), coalesce(current_setting('client_connection_check_interval', true), '0')`).Scan(&pid, &checkInterval); err != nil {
		t.Fatal(err)
	}

	ev := newEvent(t, newID(), event.TransferCreated, newID(), "acc_w", "acc_y", 7)
	other, err := database.Beginx()
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback()
	var call strings.Builder
	writeEventCall(&call, ev)
	if _, err := other.Exec(call.String()); err != nil {
		t.Fatal(err)
	}
	// Whatever the attempt starts, lib/pq's goroutine that would send a
	// cancel included, has ended when the count is back to this.
	goroutines := runtime.NumGoroutine()
	applied := make(chan error, 1)
	go func() {
		_, err := l.Apply(ctx, ev)
		applied <- err
	}()
	waitFor(t, 30*time.Second, "the attempt to wait for the other claim", func() bool {
		var waiting bool
		database.Get(&waiting, `SELECT count(*) > 0 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`, pid)
		return waiting
	})

	// The shutdown, with the lane's close of its connection (abort, which
	// takes l.mu) held back until every goroutine the shutdown woke has run
	// and blocked again: one that watches the context to cancel the
	// statement, had the lane given it the worker's context, has then
	// committed to its cancel, which the close can no longer make moot. In
	// any other schedule such a cancel may or may not be sent.
	l.mu.Lock()
	shutdown()
	waitFor(t, 30*time.Second, "the goroutines the shutdown woke to run", settled)
	l.mu.Unlock()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	select {
	case err := <-applied:
		if err == nil {
			t.Fatal("an attempt still waiting on the server was reported applied")
		}
	case <-deadline.C:
		t.Fatal("the attempt did not return when the worker's context ended")
	}
	// A cancel request is read to its end (the server closes it once it
	// has signalled the session) before the goroutine sending it ends.
	waitFor(t, 30*time.Second, "the attempt's goroutines to end", func() bool { return runtime.NumGoroutine() <= goroutines })
	if n := d.cancels.Load(); n != 0 {
		t.Errorf("%d CancelRequests reached the server when the worker's context ended, want none", n)
	}

	// Without its client, the statement runs on once the other claim is
	// gone, and commits: nothing cancelled it. (With
	// client_connection_check_interval set, the server would end it
	// instead, its transaction rolled back whole.)
	if err := other.Rollback(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the attempt's session to end on the server", func() bool {
		var gone bool
		database.Get(&gone, `SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $1`, pid)
		return gone
	})
	var claimed, moved bool
	if err := database.QueryRow(`SELECT EXISTS (SELECT 1 FROM processed_event WHERE event_id = $1),
		EXISTS (SELECT 1 FROM balance_projection WHERE account = $2 AND balance_minor = 7)`, ev.ID, ev.Transfer.ToAccount).Scan(&claimed, &moved); err != nil {
		t.Fatal(err)
	}
	if claimed != moved {
		t.Errorf("the event was claimed (%v) and its balance moved (%v): half a transaction", claimed, moved)
	}
	if !claimed && checkInterval == "0" {
		t.Error("the attempt's statement did not commit on the server after its client left: something cancelled it")
	}
}

// settled reports whether no goroutine but the caller's is running or
// waiting to run: each one woken since has run until it blocked again.
func settled() bool {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	// Each goroutine's dump begins "goroutine N [state…]:". Stopped for the
	// dump, a running goroutine is shown runnable; the caller's alone is
	// shown running.
	running := 0
	for line := range bytes.Lines(buf) {
		if !bytes.HasPrefix(line, []byte("goroutine ")) {
			continue
		}
		switch {
		case bytes.Contains(line, []byte(" [runnable")):
			return false
		case bytes.Contains(line, []byte(" [running")):
			running++
		}
	}
	return running == 1
}
