package db

import (
	"context"
	"errors"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"transferconsumer/event"
)

// testDBURL returns the URL of a database of the test's own (testDB's).
func testDBURL(t *testing.T) string {
	t.Helper()
	database := testDB(t, 1)
	var name string
	if err := database.Get(&name, `SELECT current_database()`); err != nil {
		t.Fatal(err)
	}
	database.Exec(`CREATE TABLE failover_probe (n int)`)
	adminURL := os.Getenv("TEST_DATABASE_URL")
	if adminURL == "" {
		adminURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	u, _ := url.Parse(adminURL)
	u.Path = "/" + name
	return u.String()
}

// A connection whose server says it is read-only (here a session that
// defaults to read-only transactions, as a hot standby's do) is not used
// again: the error goes up unchanged, 25006 (transient, adr/0002), and the
// next attempt runs on a new connection, which finds a writable server.
func TestReadOnlyConnectionIsDiscarded(t *testing.T) {
	base := testDBURL(t)
	var readOnly atomic.Bool
	readOnly.Store(true)
	src := func() (string, error) {
		if readOnly.Load() {
			return base + "&options=" + url.QueryEscape("-c default_transaction_read_only=on"), nil
		}
		return base, nil
	}
	database, err := OpenFrom(context.Background(), src, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer database.Close()
	var before int
	if err := database.Get(&before, `SELECT pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	readOnly.Store(false) // the "new primary" answers from now on
	// Outside a transaction: lib/pq begins each one READ WRITE, which a
	// standby refuses at BEGIN (0A000, "… during recovery").
	_, err = database.Exec(`INSERT INTO failover_probe VALUES (1)`)
	var pqErr *pq.Error
	if !errors.As(err, &pqErr) || pqErr.Code != "25006" {
		t.Fatalf("insert on the read-only session = %v, want 25006", err)
	}
	if !isReadOnly(err) || event.ClassOf(context.Background(), translate(err)) != event.ClassTransient {
		t.Errorf("25006 is not read-only or not transient: %v", translate(err))
	}
	var after int
	if err := database.Get(&after, `SELECT pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	if after == before {
		t.Errorf("the read-only connection (pid %d) was used again", before)
	}
	if err := inTx(context.Background(), database, func(tx *sqlx.Tx) error {
		_, err := tx.Exec(`INSERT INTO failover_probe VALUES (1)`)
		return err
	}); err != nil {
		t.Errorf("insert on a new connection: %v", err)
	}
}

// Without a synchronous standby (the local server has none) the watch says
// so once, in the log and in its status, and stays ready; with require, it
// refuses every transaction until a standby is named.
func TestReplicationWatch(t *testing.T) {
	base := testDBURL(t)
	for _, require := range []bool{false, true} {
		log, logs := captureLog()
		w := NewReplicationWatch(require, log)
		database, err := OpenFrom(context.Background(), func() (string, error) { return base, nil }, 4, WatchReplication(w))
		if err != nil {
			t.Fatal(err)
		}
		r, ok := w.Current()
		if !ok || r.Synchronous() || r.Commit == "" {
			t.Fatalf("read on connect: %+v, %v; want an asynchronous server (this test needs one)", r, ok)
		}
		for range 3 { // more connections, and a periodic check: one line all the same
			conn, err := database.Conn(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
		}
		if err := w.Check(context.Background(), database); err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(logs.String(), "no synchronous standby is configured"); n != 1 {
			t.Errorf("require=%v: the warning was logged %d times, want once:\n%s", require, n, logs)
		}
		if !strings.Contains(logs.String(), "synchronous_mode") {
			t.Errorf("require=%v: the log does not say how to prevent it:\n%s", require, logs)
		}
		status, ready := w.Status()
		if ready == require || !strings.Contains(status, "synchronous_standby_names") {
			t.Errorf("require=%v: Status() = %q, %v", require, status, ready)
		}
		err = inTx(context.Background(), database, func(tx *sqlx.Tx) error {
			_, err := tx.Exec(`INSERT INTO failover_probe VALUES (2)`)
			return err
		})
		if require != errors.Is(err, ErrNoSyncStandby) {
			t.Errorf("require=%v: a transaction = %v", require, err)
		}
		// A lane's attempt, which sends no BEGIN, is refused all the same.
		l := NewInbox(database).Lane(5 * time.Second)
		_, err = l.Apply(context.Background(), newEvent(t, newID(), event.TransferCreated, newID(), "acc_w", "acc_x", 5))
		l.Close()
		if require != errors.Is(err, ErrNoSyncStandby) {
			t.Errorf("require=%v: an event applied by a lane = %v", require, err)
		}
		if require {
			// A standby named (as Patroni's synchronous_mode does): the
			// refusal ends, said once. (The server itself is left alone:
			// other tests share it; integration/failover_test.go names one.)
			w.observe(Replication{StandbyNames: "standby1", Commit: "on"})
			if err := w.refusal(); err != nil {
				t.Errorf("after a standby was named: %v", err)
			}
			if status, ready := w.Status(); !ready || !strings.HasPrefix(status, "ok") {
				t.Errorf("after a standby was named: Status() = %q, %v", status, ready)
			}
			if !strings.Contains(logs.String(), "has a synchronous standby") {
				t.Errorf("the change was not logged:\n%s", logs)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			w.observe(Replication{Commit: "on"})
			err := w.WaitSynchronous(ctx, database, 10*time.Millisecond, nil)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("WaitSynchronous without a standby = %v, want it to wait until the deadline", err)
			}
		}
		database.Close()
	}
}

// What a standby answers is read-only; what a primary answers otherwise
// is not.
func TestIsReadOnly(t *testing.T) {
	tests := []struct {
		code, msg string
		want      bool
	}{
		{"25006", "cannot execute INSERT in a read-only transaction", true},
		{"0A000", "cannot set transaction read-write mode during recovery", true},
		{"0A000", "cannot execute pg_advisory_xact_lock() during recovery", true},
		{"0A000", "cached plan must not change result type", false},
		{"57P01", "terminating connection due to administrator command", false},
		{"23505", "duplicate key value violates unique constraint", false},
	}
	for _, tt := range tests {
		err := &pq.Error{Code: pq.ErrorCode(tt.code), Message: tt.msg}
		if got := isReadOnly(err); got != tt.want {
			t.Errorf("isReadOnly(%s %q) = %v", tt.code, tt.msg, got)
		}
	}
}
