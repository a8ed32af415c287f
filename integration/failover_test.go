package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"transferconsumer/db"
)

// standbyOf makes a streaming standby of primary, named name (its
// application_name, which synchronous_standby_names refers to), that
// streams through via: the primary's own address, or a proxy's that the
// test can cut to hold the standby behind.
func standbyOf(primary *pgCluster, name, via string) *pgCluster {
	t := primary.t
	t.Helper()
	s := &pgCluster{t: t, bin: primary.bin}
	s.dir = pgDataDir(t)
	s.run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(primary.port), "-U", "postgres",
		"-D", s.dir, "-R", "-X", "stream", "-c", "fast", "--no-sync")
	host, port, _ := net.SplitHostPort(via)
	// Later lines win: this replaces the primary_conninfo -R wrote.
	f, err := os.OpenFile(filepath.Join(s.dir, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "primary_conninfo = 'host=%s port=%s user=postgres application_name=%s'\n", host, port, name)
	f.Close()
	s.port = freePort(t) // chosen last: the less time before the server binds it, the better
	s.start()
	return s
}

// asyncPair starts a primary of the test's own and an asynchronous
// standby of it, streaming through a proxy (replication) that the test can
// cut to hold the standby behind; admin is the primary's.
func asyncPair(t *testing.T) (primary, standby *pgCluster, admin *sqlx.DB, replication *proxy) {
	t.Helper()
	primary = newPGCluster(t)
	admin = sqlx.MustOpen("postgres", primary.adminURL())
	t.Cleanup(func() { admin.Close() })
	replication = newProxy(t, primary.addr())
	standby = standbyOf(primary, "standby1", replication.addr)
	streaming(t, admin, "standby1", "async")
	return primary, standby, admin, replication
}

// streaming waits until the primary sees standby name streaming, in
// sync_state want ("async" or "sync").
func streaming(t *testing.T, admin *sqlx.DB, name, want string) {
	t.Helper()
	waitFor(t, 60*time.Second, "standby "+name+" streaming, "+want, func() bool {
		var state string
		admin.Get(&state, `SELECT sync_state FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'`, name)
		return state == want
	})
}

// caughtUp waits until standby has replayed all the primary (admin) has
// written so far.
func caughtUp(t *testing.T, admin *sqlx.DB, standby *pgCluster) {
	t.Helper()
	var lsn string
	admin.Get(&lsn, `SELECT pg_current_wal_lsn()::text`)
	standbyAdmin := sqlx.MustOpen("postgres", standby.adminURL())
	defer standbyAdmin.Close()
	waitFor(t, 60*time.Second, "the standby to catch up", func() bool {
		var caught bool
		standbyAdmin.Get(&caught, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, lsn)
		return caught
	})
}

// promote crashes primary (pg_ctl stop -m immediate: no shutdown
// checkpoint, sessions cut as by a power loss) and promotes standby.
func promote(primary, standby *pgCluster) {
	primary.t.Helper()
	primary.run("pg_ctl", "-D", primary.dir, "-m", "immediate", "-w", "stop")
	standby.run("pg_ctl", "-D", standby.dir, "-w", "-t", "60", "promote")
}

// failoverURL is the service's DATABASE_URL naming both servers, the
// primary first, in libpq's URI form or its keyword form.
func failoverURL(keyword bool, dbName string, servers ...*pgCluster) string {
	var hosts, ports, pairs []string
	for _, s := range servers {
		hosts, ports, pairs = append(hosts, "127.0.0.1"), append(ports, strconv.Itoa(s.port)), append(pairs, s.addr())
	}
	if keyword {
		return fmt.Sprintf("host=%s port=%s user=postgres dbname=%s sslmode=disable target_session_attrs=read-write",
			strings.Join(hosts, ","), strings.Join(ports, ","), dbName)
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write", strings.Join(pairs, ","), dbName)
}

// transfers returns n transfers among accounts accounts of e, not yet
// published, in publishMany's pattern.
func transfers(e *env, n, accounts int) []transfer {
	out := make([]transfer, n)
	for i := range out {
		from := fmt.Sprintf("acc_%02d_%s", i%accounts, e.name)
		to := fmt.Sprintf("acc_%02d_%s", (i*7+1)%accounts, e.name)
		if to == from {
			to = fmt.Sprintf("acc_%02d_%s", (i+1)%accounts, e.name)
		}
		out[i] = newTransfer(from, to, int64(1+i%97))
	}
	return out
}

// useAddr points e's own connection at the database of the same name on
// the server at addr: the new primary after a failover.
func (e *env) useAddr(addr string) {
	e.t.Helper()
	database, err := db.Open(context.Background(), fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", addr, e.name), 4)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { database.Close() })
	e.db = database
}

// A primary with a synchronous standby crashes while events stream in, and
// the standby is promoted. The service, given both hosts with
// target_session_attrs=read-write (in either of libpq's forms), finds the
// new primary and goes on: nothing is lost, doubled or dead-lettered, and
// each account's events are applied in their order. Before that, with
// REQUIRE_SYNC_STANDBY=true, it refuses to consume until the standby is
// named synchronous, and /readyz says why.
func TestFailoverToASynchronousStandbyLosesNothing(t *testing.T) {
	parallel(t)
	for _, tc := range []struct {
		name    string
		keyword bool
		batch   int
	}{
		{"URI form, BATCH_MAX 1", false, 1},
		{"keyword form, BATCH_MAX 50", true, 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each on servers of its own
			primary := newPGCluster(t)
			admin := sqlx.MustOpen("postgres", primary.adminURL())
			t.Cleanup(func() { admin.Close() })
			standby := standbyOf(primary, "standby1", primary.addr())
			streaming(t, admin, "standby1", "async")
			e := newEnvOn(t, primary.adminURL())
			e.declare(4)
			e.recordApplyOrder()

			dbURL := "DATABASE_URL=" + failoverURL(tc.keyword, e.name, primary, standby)
			batch := fmt.Sprintf("BATCH_MAX=%d", tc.batch)
			strict := startProcess(t, e.serviceEnv(4, dbURL, batch, "REQUIRE_SYNC_STANDBY=true", "INSTANCE_NAME="+e.name+"-strict"))
			base := strict.httpAddr()
			early := e.publishMany(20, 4)
			var ready map[string]any
			waitFor(t, 30*time.Second, "/readyz saying the service refuses without a synchronous standby", func() bool {
				return getJSON(t, base+"/readyz", &ready) == 503 && strings.Contains(fmt.Sprint(ready["database"]), "REQUIRE_SYNC_STANDBY")
			})
			if n := e.inboxCount(); n != 0 {
				t.Fatalf("%d events applied while the service refused", n)
			}
			if strict.count("msg", "consuming") != 0 {
				t.Fatalf("consuming while it refused")
			}
			admin.MustExec(`ALTER SYSTEM SET synchronous_standby_names = 'standby1'`)
			admin.MustExec(`SELECT pg_reload_conf()`)
			streaming(t, admin, "standby1", "sync")
			waitFor(t, 60*time.Second, "the early events applied once the standby is synchronous", func() bool { return e.inboxCount() == len(early) })
			waitFor(t, 20*time.Second, "ready, replication ok", func() bool {
				return getJSON(t, base+"/readyz", &ready) == 200 && strings.HasPrefix(fmt.Sprint(ready["replication"]), "ok")
			})
			if err := strict.stop(syscall.SIGTERM, 20*time.Second); err != nil {
				t.Errorf("exit after SIGTERM: %v", err)
			}
			// The promoted standby will have no standby of its own: with
			// REQUIRE_SYNC_STANDBY the service would rightly refuse there.
			proc := startProcess(t, e.serviceEnv(4, dbURL, batch, "APPLY_TIMEOUT=5s", "INSTANCE_NAME="+e.name))
			proc.waitConsuming(1)

			// A backlog, the primary crashed while the service works through
			// it, and more events after the promotion.
			stream, more := transfers(e, 2000, 16), transfers(e, 500, 16)
			var published atomic.Int64
			if err := e.publishPipelined(stream, &published); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 60*time.Second, "a fifth of the backlog applied", func() bool { return e.inboxCount() >= len(early)+len(stream)/5 })
			promote(primary, standby)
			e.useAddr(standby.addr())
			t.Logf("primary crashed and standby promoted with %d of %d events of the backlog on the new primary",
				e.inboxCount()-len(early), len(stream))
			if err := e.publishPipelined(more, &published); err != nil {
				t.Fatal(err)
			}
			events := append(append(early, stream...), more...)
			waitFor(t, 120*time.Second, "every event applied on the new primary", func() bool { return e.inboxCount() == len(events) })
			if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
				t.Errorf("exit after SIGTERM: %v", err)
			}
			e.checkExactlyOnce(events)
			e.checkAccountOrder(events)
			if n := proc.count("outcome", "dead_lettered") + strict.count("outcome", "dead_lettered"); n != 0 {
				t.Errorf("%d events dead-lettered", n)
			}
		})
	}
}

// With asynchronous replication, the loss the warning predicts happens: the
// standby is held behind (its replication stream cut), the primary applies
// and the service acks more events, the primary crashes and the standby is
// promoted. Those events are acked, gone from the broker, and missing on
// the new primary; the service said at start, in its log and in /readyz,
// that a failover could lose acked events.
func TestFailoverToAnAsynchronousStandbyLosesAckedEvents(t *testing.T) {
	parallel(t) // on servers of its own
	primary, standby, admin, replication := asyncPair(t)
	e := newEnvOn(t, primary.adminURL())
	e.declare(2)

	proc := startProcess(t, e.serviceEnv(2, "DATABASE_URL="+failoverURL(false, e.name, primary, standby)))
	proc.waitConsuming(1)
	base := proc.httpAddr()
	var ready map[string]any
	waitFor(t, 30*time.Second, "ready, with the warning under replication", func() bool {
		return getJSON(t, base+"/readyz", &ready) == 200 && strings.HasPrefix(fmt.Sprint(ready["replication"]), "warning")
	})
	for _, want := range []string{"a failover may lose", "synchronous_mode", "synchronous_standby_names"} {
		if !strings.Contains(fmt.Sprint(ready["replication"]), want) {
			t.Errorf("/readyz replication = %q, does not say %q", ready["replication"], want)
		}
	}
	if n := proc.count("msg", db.AsyncWarning); n != 1 {
		t.Errorf("the warning was logged %d times, want once", n)
	}

	before := e.publishMany(100, 4)
	waitFor(t, 60*time.Second, "the first events applied", func() bool { return e.inboxCount() == len(before) })
	caughtUp(t, admin, standby)

	replication.down() // the standby falls behind from here
	after := e.publishMany(100, 4)
	waitFor(t, 60*time.Second, "the later events applied and acked", func() bool {
		return e.inboxCount() == len(before)+len(after) && e.ready("transfers.0")+e.ready("transfers.1") == 0 &&
			proc.count("outcome", "applied") == len(before)+len(after)
	})
	promote(primary, standby)
	e.useAddr(standby.addr())
	missing := 0
	for _, ev := range after {
		if e.inboxRows(ev.EventID) == 0 {
			missing++
		}
	}
	t.Logf("after the failover the new primary lacks %d of the %d events acked while the standby was behind", missing, len(after))
	if missing == 0 {
		t.Errorf("no acked event is missing on the new primary: the test held nothing back")
	}
	for _, ev := range before {
		if e.inboxRows(ev.EventID) != 1 {
			t.Errorf("event %s, replicated before the cut, is missing", ev.EventID)
		}
	}
	if e.ready("transfers.0")+e.ready("transfers.1") != 0 {
		t.Errorf("the broker still holds events: they were not acked")
	}
	proc.stop(syscall.SIGTERM, 20*time.Second)
}
