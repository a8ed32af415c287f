package integration

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/event"
)

// Durability and isolation do not depend on a DBA's defaults: whatever
// ALTER DATABASE sets, an event's transaction commits with synchronous_commit
// on (or stricter, kept) and runs at READ COMMITTED, which the advisory
// lock then read in apply_event relies on. A trigger records what the
// transaction saw.
func TestTransactionsIgnoreWeakerDatabaseDefaults(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.db.MustExec(`CREATE TABLE seen (sync TEXT, isolation TEXT)`)
	e.db.MustExec(`CREATE FUNCTION record_settings() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO seen VALUES (current_setting('synchronous_commit'), current_setting('transaction_isolation'));
			RETURN NEW;
		END $$`)
	e.db.MustExec(`CREATE TRIGGER record_settings AFTER INSERT ON processed_event FOR EACH ROW EXECUTE FUNCTION record_settings()`)
	tests := []struct {
		sync, isolation         string // the database's defaults
		wantSync, wantIsolation string // what the event's transaction ran with
	}{
		{"off", "serializable", "on", "read committed"},
		{"local", "repeatable read", "on", "read committed"},
		{"remote_write", "read committed", "on", "read committed"},
		{"remote_apply", "repeatable read", "remote_apply", "read committed"},
	}
	for _, tt := range tests {
		e.db.MustExec(`ALTER DATABASE ` + pq.QuoteIdentifier(e.name) + ` SET synchronous_commit = ` + pq.QuoteLiteral(tt.sync))
		e.db.MustExec(`ALTER DATABASE ` + pq.QuoteIdentifier(e.name) + ` SET default_transaction_isolation = ` + pq.QuoteLiteral(tt.isolation))
		fresh, err := db.Open(context.Background(), e.dbURL, 2) // new sessions take the new defaults
		if err != nil {
			t.Fatal(err)
		}
		var sessionSync string
		fresh.Get(&sessionSync, `SHOW synchronous_commit`)
		if sessionSync != tt.sync {
			t.Fatalf("the session's default is %q, want %q: the test would prove nothing", sessionSync, tt.sync)
		}
		ev, err := event.Decode(newTransfer("acc_d_"+e.name, "acc_e_"+e.name, 1).body(), "", "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.NewInbox(fresh).Apply(context.Background(), ev); err != nil {
			t.Fatalf("defaults %s/%s: apply: %v", tt.sync, tt.isolation, err)
		}
		fresh.Close()
		var got struct {
			Sync      string `db:"sync"`
			Isolation string `db:"isolation"`
		}
		e.db.Get(&got, `DELETE FROM seen RETURNING sync, isolation`)
		if got.Sync != tt.wantSync || got.Isolation != tt.wantIsolation {
			t.Errorf("defaults %s/%s: the event's transaction ran with %s/%s, want %s/%s",
				tt.sync, tt.isolation, got.Sync, got.Isolation, tt.wantSync, tt.wantIsolation)
		}
	}
}

// A COMMIT is never cancelled: cancelled while it waits for a synchronous
// standby, PostgreSQL would report success for a commit that is only local.
// Here no standby ever answers (and the database's default says
// synchronous_commit off, which the service overrides): the commit waits far
// past APPLY_TIMEOUT, the event stays in hand, and once the standby
// requirement is lifted it is acked, applied once.
func TestCommitWaitingForAStandbyIsNeverCancelled(t *testing.T) {
	parallel(t)
	cluster := newPGCluster(t)
	e := newEnvOn(t, cluster.adminURL())
	admin := sqlx.MustOpen("postgres", cluster.adminURL())
	t.Cleanup(func() { admin.Close() }) // after the reset below: cleanups run last-in, first-out
	e.db.MustExec(`ALTER DATABASE ` + pq.QuoteIdentifier(e.name) + ` SET synchronous_commit = off`)
	lift := standbyThatNeverAnswers(t, admin)
	service, err := db.Open(context.Background(), e.dbURL, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer service.Close()
	// The commit below waits five times as long as this. On a loaded
	// machine an attempt may still time out before its COMMIT and be
	// retried: harmless, and told apart from a cancelled commit at the end.
	const applyTimeout = time.Second
	svc := e.startWith(1, db.NewInbox(service), func(c *consumer.Config) { c.ApplyTimeout = applyTimeout })
	tr := newTransfer("acc_s_"+e.name, "acc_t_"+e.name, 3)
	e.publish(tr)

	waitFor(t, 30*time.Second, "the commit waiting for the standby for 5× APPLY_TIMEOUT", func() bool {
		var waiting bool
		admin.Get(&waiting, `SELECT count(*) > 0 FROM pg_stat_activity
			WHERE datname = $1 AND wait_event = 'SyncRep' AND now() - xact_start > $2::interval`,
			e.name, (5 * applyTimeout).String())
		return waiting
	})
	if n := svc.rec.count(); n != 0 {
		t.Fatalf("decided while the commit waited for the standby: %+v", svc.rec.all)
	}
	lift()
	waitFor(t, 30*time.Second, "the event acked once the commit returned", func() bool { return len(svc.rec.of(tr.EventID)) == 1 })
	// A COMMIT cancelled while it waits stays committed on the primary (with
	// a warning), so an attempt after it would find its own claim: the event
	// would be acked as a duplicate. Attempts that timed out before their
	// COMMIT leave no claim behind.
	if d := svc.rec.of(tr.EventID)[0]; d.Action != consumer.ActionAck || d.Duplicate {
		t.Errorf("want applied by an attempt whose commit was not cancelled, got %+v", d)
	} else if d.Retries != 0 {
		t.Logf("applied after %d attempts that timed out before their COMMIT", d.Retries)
	}
	if got := e.balance(tr.Data.ToAccount); got != 3 {
		t.Errorf("balance = %d, want 3", got)
	}
}

// The same commit, when the worker shuts down while it waits for the
// standby: the lane closes its connection rather than cancel the
// statement. The event is not reported applied, and nothing makes its
// commit a local-only one: while no standby answers, its claim stays
// invisible and its session waits; once the requirement is lifted, it
// commits whole, and the server never logged the cancelled wait it logs
// when a cancel ends one. (Which of lib/pq's goroutine and the lane's
// close acts first decides whether a statement run under the worker's
// context would send a cancel here; db.TestAShutdownSendsNoCancelRequest
// forces the schedule in which it would, and counts the cancel requests.)
func TestAShutdownNeverCancelsACommitWaitingForAStandby(t *testing.T) {
	parallel(t)
	cluster := newPGCluster(t)
	e := newEnvOn(t, cluster.adminURL())
	admin := sqlx.MustOpen("postgres", cluster.adminURL())
	t.Cleanup(func() { admin.Close() })
	lift := standbyThatNeverAnswers(t, admin)
	service, err := db.Open(context.Background(), e.dbURL, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer service.Close()
	lane := db.NewInbox(service).Lane(10 * time.Second)
	defer lane.Close()
	tr := newTransfer("acc_u_"+e.name, "acc_v_"+e.name, 4)
	ev, err := event.Decode(tr.body(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	worker, shutdown := context.WithCancel(context.Background())
	defer shutdown()
	applied := make(chan error, 1)
	go func() {
		_, err := lane.Apply(worker, ev)
		applied <- err
	}()

	var pid int
	waitFor(t, 30*time.Second, "the commit to wait for the standby", func() bool {
		return admin.Get(&pid, `SELECT pid FROM pg_stat_activity WHERE datname = $1 AND wait_event = 'SyncRep'`, e.name) == nil
	})
	shutdown()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	select {
	case err := <-applied:
		if err == nil {
			t.Fatal("reported applied while its commit waited for a standby that never answered")
		}
	case <-deadline.C:
		t.Fatal("the attempt did not return when the worker's context ended")
	}
	var claims, waiting int
	e.db.Get(&claims, `SELECT count(*) FROM processed_event WHERE event_id = $1`, tr.EventID)
	admin.Get(&waiting, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep'`, pid)
	if claims != 0 || waiting != 1 {
		t.Errorf("after the shutdown, without a standby: %d claims visible, %d sessions waiting for it; want 0 and 1", claims, waiting)
	}

	lift()
	waitFor(t, 30*time.Second, "the attempt's session to end", func() bool {
		var n int
		return admin.Get(&n, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid) == nil && n == 0
	})
	if got := e.balance(tr.Data.ToAccount); got != 4 {
		t.Errorf("balance = %d once the standby requirement was lifted, want 4: the commit did not complete", got)
	}
	log, err := os.ReadFile(filepath.Join(cluster.dir, "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	if i := bytes.Index(log, []byte("canceling wait for synchronous replication")); i >= 0 {
		t.Errorf("a cancel ended the commit's wait for the standby, leaving it committed locally only: %s", log[i:min(len(log), i+200)])
	}
}

// standbyThatNeverAnswers has every commit on admin's server wait for a
// synchronous standby named 'nobody', and returns once one does. ALTER
// SYSTEM and pg_reload_conf only signal the server: commits wait for a
// standby only once its checkpointer has read the new setting (it tells
// the backends that a standby is named), and until then they commit at
// once. A probe commit, on a connection of its own, that waits shows the
// moment. lift, also run at the test's end, removes the requirement; the
// probe then commits too.
func standbyThatNeverAnswers(t *testing.T, admin *sqlx.DB) (lift func()) {
	t.Helper()
	probe, err := admin.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := probe.QueryRowContext(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	var seen atomic.Bool // the probe's commit was seen waiting
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer probe.Close()
		// An xid makes the commit write a commit record, which waits once
		// the requirement holds; until then the commits return at once.
		for !seen.Load() {
			if _, err := probe.ExecContext(context.Background(), `SELECT txid_current()`); err != nil {
				return
			}
		}
	}()
	// Cleanups run last-in, first-out: the requirement is removed, then the
	// probe's commit returns, then admin closes.
	t.Cleanup(func() {
		seen.Store(true)
		<-done
	})
	t.Cleanup(func() {
		admin.Exec(`ALTER SYSTEM RESET synchronous_standby_names`)
		admin.Exec(`SELECT pg_reload_conf()`)
	})
	admin.MustExec(`ALTER SYSTEM SET synchronous_standby_names = 'nobody'`)
	admin.MustExec(`SELECT pg_reload_conf()`)
	waitFor(t, 30*time.Second, "a commit to wait for the standby named 'nobody'", func() bool {
		var waiting bool
		return admin.Get(&waiting, `SELECT count(*) > 0 FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep'`, pid) == nil && waiting
	})
	seen.Store(true)
	return func() {
		admin.MustExec(`ALTER SYSTEM RESET synchronous_standby_names`)
		admin.MustExec(`SELECT pg_reload_conf()`)
	}
}
