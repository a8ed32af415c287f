package integration

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"transferconsumer/db"
)

// dbFault is one test's database world for a fault: the service binary
// connects as a role of the test's own, so that the fault can be aimed at
// the service alone, and through a proxy, so that its address can move.
type dbFault struct {
	*env
	role   string
	admin  *sqlx.DB // the server's maintenance database, as superuser
	proxy  *proxy
	server string // the server the proxy sends to
}

// Every failure the environment causes, provoked for real on PostgreSQL while
// events arrive, blocks the queue with the message in hand and retries it in
// place: nothing is dead-lettered, no delivery is spent (every event is
// applied on its first delivery), /readyz says 503 with the reason during
// the fault and 200 after it, and every event is applied exactly once
// (adr/0002). The delivery limit is 2, far below the retries each row makes.
func TestDatabaseFaultsBlockTheQueueNeverTheDLQ(t *testing.T) {
	parallel(t)
	if unavailable != "" {
		t.Skip(unavailable)
	}
	var primary, standby *pgCluster // the test's own servers, for the rows that need them
	rows := []struct {
		name     string
		own      bool   // on a server of the test's own (stopped, or failed over)
		sqlstate string // in the blocked queue's reason, when the server answers
		fault    func(f *dbFault) (heal func())
	}{
		{name: "database closed for maintenance", sqlstate: "55000", fault: func(f *dbFault) func() {
			f.adminExec(`ALTER DATABASE %s ALLOW_CONNECTIONS false`, f.dbName())
			f.terminate()
			return func() { f.adminExec(`ALTER DATABASE %s ALLOW_CONNECTIONS true`, f.dbName()) }
		}},
		{name: "role set NOLOGIN", sqlstate: "28000", fault: func(f *dbFault) func() {
			f.adminExec(`ALTER ROLE %s NOLOGIN`, f.roleName())
			f.terminate()
			return func() { f.adminExec(`ALTER ROLE %s LOGIN`, f.roleName()) }
		}},
		{name: "role renamed, as with rotated credentials", sqlstate: "28000", fault: func(f *dbFault) func() {
			f.adminExec(`ALTER ROLE %s RENAME TO %s`, f.roleName(), pq.QuoteIdentifier(f.role+"_old"))
			f.terminate()
			return func() { f.adminExec(`ALTER ROLE %s RENAME TO %s`, pq.QuoteIdentifier(f.role+"_old"), f.roleName()) }
		}},
		{name: "database renamed", sqlstate: "3D000", fault: func(f *dbFault) func() {
			old := pq.QuoteIdentifier(f.name + "_old")
			f.adminExec(`ALTER DATABASE %s ALLOW_CONNECTIONS false`, f.dbName())
			f.terminateAll()
			f.adminExec(`ALTER DATABASE %s RENAME TO %s`, f.dbName(), old)
			return func() {
				f.adminExec(`ALTER DATABASE %s RENAME TO %s`, old, f.dbName())
				f.adminExec(`ALTER DATABASE %s ALLOW_CONNECTIONS true`, f.dbName())
			}
		}},
		{name: "privilege revoked", sqlstate: "42501", fault: func(f *dbFault) func() {
			f.db.MustExec(`REVOKE UPDATE ON balance_projection FROM ` + f.roleName())
			return func() { f.db.MustExec(`GRANT UPDATE ON balance_projection TO ` + f.roleName()) }
		}},
		{name: "function dropped, then migrated again", sqlstate: "42883", fault: func(f *dbFault) func() {
			f.db.MustExec(`DROP FUNCTION apply_event`) // the only one of its name
			return func() {
				// Migrate finds the function missing and makes it again
				// from its file.
				if _, err := db.Migrate(context.Background(), f.db, os.DirFS("../sql")); err != nil {
					f.t.Fatalf("migrate again: %v", err)
				}
			}
		}},
		{name: "table missing, as before a migration", sqlstate: "42P01", fault: func(f *dbFault) func() {
			f.db.MustExec(`ALTER TABLE pending_transition RENAME TO pending_transition_away`)
			return func() { f.db.MustExec(`ALTER TABLE pending_transition_away RENAME TO pending_transition`) }
		}},
		{name: "lock_timeout with a lock held", sqlstate: "55P03", fault: func(f *dbFault) func() {
			return f.holdLockWith("lock_timeout")
		}},
		{name: "statement_timeout with a lock held", sqlstate: "57014", fault: func(f *dbFault) func() {
			return f.holdLockWith("statement_timeout")
		}},
		{name: "failover behind a stale address: the old primary is a standby", own: true, sqlstate: "0A000",
			fault: func(f *dbFault) func() {
				f.proxy.retarget(standby.addr())
				return func() { f.proxy.retarget(primary.addr()) }
			}},
		{name: "PostgreSQL stopped and started", own: true, fault: func(f *dbFault) func() {
			primary.stop()
			return primary.start
		}},
	}
	parent := t
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			server := shared.databaseURL
			if row.own {
				if primary == nil { // made once, for every row that needs them
					primary = newPGCluster(parent)
					standby = primary.standby()
				}
				server = primary.adminURL()
			}
			f := newDBFault(t, server)
			svcURL, _ := url.Parse(f.dbURL)
			svcURL.User = url.User(f.role)
			svcURL.Host = f.proxy.addr
			proc := startProcess(t, f.serviceEnv(2, "DATABASE_URL="+svcURL.String(),
				"INSTANCE_NAME="+f.name, "APPLY_TIMEOUT=2s", "RETRY_MIN=20ms", "RETRY_MAX=300ms"))
			proc.waitConsuming(1)
			base := proc.httpAddr()

			before := f.publishMany(4, 4)
			waitFor(t, 30*time.Second, "the events before the fault applied", func() bool { return f.inboxCount() == len(before) })
			var ready map[string]any
			waitFor(t, 20*time.Second, "ready before the fault", func() bool { return getJSON(t, base+"/readyz", &ready) == 200 })

			heal := row.fault(f)
			during := f.publishMany(12, 4)
			waitFor(t, 30*time.Second, "/readyz 503 naming the blocked queue and the cause", func() bool {
				if getJSON(t, base+"/readyz", &ready) != 503 {
					return false
				}
				blocked, _ := ready["blocked_queues"].([]any)
				for _, b := range blocked {
					if reason := fmt.Sprint(b.(map[string]any)["reason"]); strings.Contains(reason, row.sqlstate) {
						return true
					}
				}
				return false
			})
			waitFor(t, 30*time.Second, "retries far past the delivery limit", func() bool {
				return metricSum(getText(t, base+"/metrics"), "transferconsumer_db_retries_total") >= float64(3*(f.limit+1))
			})
			t.Logf("during the fault: %v", ready["blocked_queues"])
			heal()

			waitFor(t, 60*time.Second, "every event applied after the fault", func() bool {
				n, err := f.count()
				return err == nil && n == len(before)+len(during)
			})
			waitFor(t, 20*time.Second, "ready again", func() bool { return getJSON(t, base+"/readyz", &ready) == 200 })
			if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
				t.Errorf("exit after SIGTERM: %v", err)
			}
			f.checkExactlyOnce(append(before, during...))
			proc.mu.Lock()
			defer proc.mu.Unlock()
			events := 0
			for _, line := range proc.lines {
				if line["msg"] != "event" {
					continue
				}
				events++
				if line["outcome"] != "applied" || line["delivery_count"] != float64(0) || line["redelivered"] != false {
					t.Errorf("want every event applied on its first delivery, got %v", line)
				}
			}
			if events != len(before)+len(during) {
				t.Errorf("%d decisions logged, want %d", events, len(before)+len(during))
			}
		})
	}
}

// newDBFault makes the test's vhost and database on the server of
// adminURL, a login role that may do what the service does there, and a
// proxy to the server.
func newDBFault(t *testing.T, adminURL string) *dbFault {
	t.Helper()
	f := &dbFault{env: newEnvOn(t, adminURL), role: "tc_role_" + randomSuffix()}
	f.admin = sqlx.MustOpen("postgres", adminURL)
	t.Cleanup(func() { f.admin.Close() })
	u, _ := url.Parse(adminURL)
	f.server = u.Host
	f.proxy = newProxy(t, u.Host)

	f.adminExec(`CREATE ROLE %s LOGIN`, f.roleName())
	t.Cleanup(func() {
		f.terminate()
		f.db.Exec(`DROP OWNED BY ` + f.roleName())
		f.admin.Exec(`DROP ROLE IF EXISTS ` + f.roleName())
	})
	for _, grant := range []string{
		`GRANT ALL ON SCHEMA public TO %s`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO %s`,
		`GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO %s`,
	} {
		f.db.MustExec(fmt.Sprintf(grant, f.roleName()))
	}
	return f
}

func (f *dbFault) roleName() string { return pq.QuoteIdentifier(f.role) }
func (f *dbFault) dbName() string   { return pq.QuoteIdentifier(f.name) }

func (f *dbFault) adminExec(format string, args ...any) {
	f.t.Helper()
	if _, err := f.admin.Exec(fmt.Sprintf(format, args...)); err != nil {
		f.t.Fatal(err)
	}
}

// terminate ends the sessions of the service's role, as a DBA does before
// maintenance: the service must open new ones, under the new rules.
func (f *dbFault) terminate() {
	f.admin.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename IN ($1, $2)`, f.role, f.role+"_old")
}

// terminateAll ends every session of the test's database, the test's own
// included.
func (f *dbFault) terminateAll() {
	f.admin.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, f.name)
}

// holdLockWith sets setting to 200ms for the service's role, makes its
// sessions start again to take it, and holds a lock on the balances until
// the returned heal releases it.
func (f *dbFault) holdLockWith(setting string) func() {
	f.adminExec(`ALTER ROLE %s SET %s = '200ms'`, f.roleName(), setting)
	f.terminate()
	tx := f.db.MustBegin()
	tx.MustExec(`LOCK TABLE balance_projection IN ACCESS EXCLUSIVE MODE`)
	return func() {
		tx.Rollback()
		f.adminExec(`ALTER ROLE %s RESET %s`, f.roleName(), setting)
	}
}

// count is inboxCount that tolerates a database that is just coming back.
func (f *dbFault) count() (int, error) {
	var n int
	err := f.db.Get(&n, `SELECT count(*) FROM processed_event`)
	return n, err
}

// metricValue returns the value of an unlabelled series in a Prometheus
// text exposition, or -1.
func metricValue(text, name string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(text)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// metricSum returns the sum of the series of name, in a Prometheus text
// exposition, whose labels include each of match (`key="value"`), or -1
// when there is none.
func metricSum(text, name string, match ...string) float64 {
	sum, found := 0.0, false
	for _, m := range regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(name)+`(?:\{([^}]*)\})? (\S+)$`).FindAllStringSubmatch(text, -1) {
		labels := "," + m[1] + ","
		if slices.ContainsFunc(match, func(l string) bool { return !strings.Contains(labels, ","+l+",") }) {
			continue
		}
		v, _ := strconv.ParseFloat(m[2], 64)
		sum, found = sum+v, true
	}
	if !found {
		return -1
	}
	return sum
}
