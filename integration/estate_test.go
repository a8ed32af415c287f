package integration

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// A locked-down estate: the schema's owner migrates, the service runs as a
// role with no privilege beyond data, and its credentials come from files
// that are rewritten when the passwords rotate.

// The owner migrates an empty database with `migrate --grant-to`; the
// service then runs as that data-only role, with the default settings,
// and applies, deduplicates and dead-letters as ever, and its retention
// prunes. The database is locked down beyond PostgreSQL 15's defaults:
// PUBLIC may not connect, use the schema, or execute new functions.
func TestDataOnlyRoleRunsOnTheSchemaItsOwnerMigrated(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	ownerURL := e.useEmptyDatabase()
	e.lockDown()
	role, roleURL := e.serviceRole("")

	out, err := runCommand(t, []string{"DATABASE_URL=" + ownerURL}, "migrate", "--grant-to", role)
	files := migrationFiles(t)
	if err != nil || !strings.Contains(out, fmt.Sprintf("applied %d migration(s)", len(files))) || !strings.Contains(out, "granted "+role) {
		t.Fatalf("migrate --grant-to %s: %v\n%s", role, err, out)
	}
	// An inbox row old enough for retention, so that the role's prune has
	// something to delete.
	e.db.MustExec(`INSERT INTO processed_event (event_id, event_type, processed_at, fingerprint)
		VALUES (` + prunedID + `, 'TransferCreated', now() - interval '800 hours', '\x00')`)

	proc := startProcess(t, e.serviceEnv(2, "DATABASE_URL="+roleURL, "INSTANCE_NAME="+e.name+"-svc", "PRUNE_INTERVAL=200ms"))
	proc.waitConsuming(1)
	base := proc.httpAddr()

	from, to := "acc_a_"+e.name, "acc_b_"+e.name
	created := newTransfer(from, to, 100)
	conflict := created
	conflict.Data.AmountMinor = 101 // the same eventId with other content
	failed := newTransfer(from, to, 40)
	failed.EventType = "TransferFailed"
	late := failed
	late.EventID, late.EventType = newUUID(), "TransferCreated" // its creation, after the failure
	for _, tr := range []transfer{created, created, conflict, failed, late} {
		e.publish(tr)
	}
	e.publishRaw(prefix, from, []byte(`{"eventId": "not json`), "")
	waitFor(t, 30*time.Second, "every event decided", func() bool {
		return proc.count("outcome", "applied") == 3 && proc.count("outcome", "duplicate") == 1 &&
			proc.count("outcome", "dead_lettered") == 2
	})
	waitFor(t, 30*time.Second, "the role's prune", func() bool { return proc.count("msg", "inbox pruned") >= 1 })

	if b := e.balance(from); b != -100 {
		t.Errorf("%s balance %d, want -100 (the failed transfer given back)", from, b)
	}
	var conflicts int
	e.db.Get(&conflicts, `SELECT count(*) FROM producer_conflict`)
	if conflicts != 1 {
		t.Errorf("%d producer conflicts recorded, want 1", conflicts)
	}
	var ready map[string]any
	if code := getJSON(t, base+"/readyz", &ready); code != 200 || ready["schema"] != "ok" {
		t.Errorf("/readyz = %d %v, want 200 with the schema ok", code, ready)
	}
	if age := metricValue(getText(t, base+"/metrics"), "transferconsumer_inbox_oldest_row_age_seconds"); age < 0 {
		t.Errorf("the oldest inbox row's age is %v: the role could not read it", age)
	}
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	// Nothing refused the role: no queue blocked, no error but the two
	// dead letters' decisions.
	proc.mu.Lock()
	defer proc.mu.Unlock()
	for _, line := range proc.lines {
		msg := fmt.Sprint(line["msg"])
		if (line["level"] == "ERROR" && msg != "event") || strings.HasPrefix(msg, "queue blocked") {
			t.Errorf("as a data-only role: %v", line)
		}
	}
}

// The schema lacks a migration and the service's role may not apply it:
// the service says which one, and that the schema's owner must run
// migrate, in the log and in /readyz; it consumes nothing; it tries to
// migrate once only, then checks at the reconnect backoff; and once the
// owner has migrated it consumes, without a restart.
func TestSchemaBehindAndARoleThatMayNotMigrate(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	ownerURL := e.useEmptyDatabase()
	role, roleURL := e.serviceRole("")
	if out, err := runCommand(t, []string{"DATABASE_URL=" + ownerURL}, "migrate", "--grant-to", role); err != nil {
		t.Fatalf("migrate --grant-to: %v\n%s", err, out)
	}
	files, _ := filepath.Glob("../sql/*.sql")
	last := filepath.Base(files[len(files)-1])
	e.db.MustExec(`DELETE FROM schema_migration WHERE name = $1`, last)

	e.declare(2)
	tr := newTransfer("acc_a_"+e.name, "acc_b_"+e.name, 7)
	e.publish(tr)
	proc := startProcess(t, e.serviceEnv(2, "DATABASE_URL="+roleURL, "INSTANCE_NAME="+e.name+"-svc"))
	base := proc.httpAddr()

	var ready map[string]any
	waitFor(t, 30*time.Second, "/readyz naming the missing migration", func() bool {
		code := getJSON(t, base+"/readyz", &ready)
		missing, _ := ready["missing_migrations"].([]any)
		return code == 503 && len(missing) == 1 && missing[0] == last
	})
	schema := fmt.Sprint(ready["schema"])
	for _, want := range []string{last, "role " + role + " may not change the schema", "(42501)",
		"the schema's owner must run `transferconsumer migrate`"} {
		if !strings.Contains(schema, want) {
			t.Errorf("/readyz's schema does not say %q: %s", want, schema)
		}
	}
	if ready["broker"] != "not started: waiting for the schema" || ready["database"] != "ok" {
		t.Errorf("/readyz = %v", ready)
	}
	// Four checks, each logged (the log thins out to checks 1, 2, 4, 8, …).
	waitFor(t, 30*time.Second, "four checks of the schema", func() bool {
		return proc.count("checks", "4") >= 1
	})
	if n := proc.count("msg", "the database refused the service's migration: it tries no more, and waits until the schema's owner has run `transferconsumer migrate`"); n != 1 {
		t.Errorf("the migration was refused %d times, want once", n)
	}
	if got := proc.field("the schema is behind: consuming nothing until it is current", "missing"); got != "["+last+"]" {
		t.Errorf("the log names %s as missing, want [%s]", got, last)
	}
	for i := range 2 {
		if q, ok := e.inspect(e.topology(2).Queue(i)); !ok || q.Consumers != 0 {
			t.Errorf("queue %d: %+v, want no consumer", i, q)
		}
	}
	if e.inboxCount() != 0 || e.ready(e.topology(2).Queue(0))+e.ready(e.topology(2).Queue(1)) != 1 {
		t.Errorf("the event was consumed while the schema was behind")
	}

	if out, err := runCommand(t, []string{"DATABASE_URL=" + ownerURL}, "migrate"); err != nil || !strings.Contains(out, "applied 1 migration(s) ["+last+"]") {
		t.Fatalf("the owner's migrate: %v\n%s", err, out)
	}
	waitFor(t, 30*time.Second, "the event applied once the owner migrated", func() bool { return e.inboxRows(tr.EventID) == 1 })
	waitFor(t, 20*time.Second, "ready", func() bool { return getJSON(t, base+"/readyz", &ready) == 200 })
	if n := proc.count("msg", "the database refused the service's migration: it tries no more, and waits until the schema's owner has run `transferconsumer migrate`"); n != 1 {
		t.Errorf("the migration was refused %d times, want once", n)
	}
}

// MIGRATE=false: the service changes nothing of the database, though its
// role may: it creates no database, applies no migration, says what is
// missing, and consumes once the owner has migrated.
func TestMigrateFalseNeverChangesTheDatabase(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	name := e.name + "_own"
	admin := sqlx.MustOpen("postgres", e.b.databaseURL)
	t.Cleanup(func() { admin.Close() })
	t.Cleanup(func() { admin.Exec("DROP DATABASE IF EXISTS " + pq.QuoteIdentifier(name) + " WITH (FORCE)") })
	u, _ := url.Parse(e.b.databaseURL)
	u.Path = "/" + name

	e.declare(2)
	tr := newTransfer("acc_a_"+e.name, "acc_b_"+e.name, 7)
	e.publish(tr)
	proc := startProcess(t, e.serviceEnv(2, "DATABASE_URL="+u.String(), "MIGRATE=false", "INSTANCE_NAME="+e.name+"-svc"))
	base := proc.httpAddr()
	var ready map[string]any
	waitFor(t, 30*time.Second, "/readyz saying the database does not exist", func() bool {
		return getJSON(t, base+"/readyz", &ready) == 503 && strings.Contains(fmt.Sprint(ready["database"]), "3D000")
	})
	waitFor(t, 30*time.Second, "a few attempts to open it", func() bool {
		return proc.count("msg", "the database refused the service, waiting") >= 2
	})
	var exists bool
	admin.Get(&exists, `SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)`, name)
	if exists {
		t.Fatal("with MIGRATE=false the service created its database")
	}

	admin.MustExec("CREATE DATABASE " + pq.QuoteIdentifier(name))
	files := migrationFiles(t)
	waitFor(t, 30*time.Second, "/readyz naming every migration", func() bool {
		code := getJSON(t, base+"/readyz", &ready)
		missing, _ := ready["missing_migrations"].([]any)
		return code == 503 && len(missing) == len(files)
	})
	if s := fmt.Sprint(ready["schema"]); !strings.Contains(s, "MIGRATE=false") || !strings.Contains(s, "`transferconsumer migrate`") {
		t.Errorf("/readyz's schema: %s", s)
	}
	waitFor(t, 30*time.Second, "four checks of the schema", func() bool { return proc.count("checks", "4") >= 1 })
	e.db.Close() // newEnv's; the harness closes the one it finds at the end
	e.db = sqlx.MustOpen("postgres", u.String())
	var tables int
	e.db.Get(&tables, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`)
	if tables != 0 || proc.count("msg", "migrated") != 0 {
		t.Fatalf("with MIGRATE=false the service made %d tables", tables)
	}

	if out, err := runCommand(t, []string{"DATABASE_URL=" + u.String()}, "migrate"); err != nil {
		t.Fatalf("the owner's migrate: %v\n%s", err, out)
	}
	waitFor(t, 30*time.Second, "the event applied once the owner migrated", func() bool { return e.inboxRows(tr.EventID) == 1 })
}

// DATABASE_URL_FILE is read again for each new connection: the role's
// password is changed and its sessions ended, the service is refused, and
// once the file is rewritten it goes on, without a restart. On a server of
// the test's own, where passwords are checked (the shared one trusts).
func TestDatabasePasswordRotatedInTheFile(t *testing.T) {
	parallel(t)
	if unavailable != "" {
		t.Skip(unavailable)
	}
	pg := newPGCluster(t)
	pg.checkPasswords()
	e := newEnvOn(t, pg.adminURL())
	one, two := "pw-one-"+randomSuffix(), "pw-two-"+randomSuffix()
	role, roleURL := e.serviceRole(one)
	if out, err := runCommand(t, []string{"DATABASE_URL=" + e.dbURL}, "migrate", "--grant-to", role); err != nil {
		t.Fatalf("migrate --grant-to: %v\n%s", err, out)
	}
	pg.waitRefused(e, role, "wrong")

	file := writeSecretFile(t, roleURL)
	proc := startProcess(t, e.serviceEnv(2, "DATABASE_URL=", "DATABASE_URL_FILE="+file, "INSTANCE_NAME="+e.name+"-svc",
		"APPLY_TIMEOUT=2s", "RETRY_MIN=20ms", "RETRY_MAX=300ms"))
	proc.waitConsuming(1)
	base := proc.httpAddr()
	before := e.publishMany(4, 4)
	waitFor(t, 30*time.Second, "the events before the rotation applied", func() bool { return e.inboxCount() == len(before) })

	e.db.MustExec("ALTER ROLE " + pq.QuoteIdentifier(role) + " PASSWORD " + pq.QuoteLiteral(two))
	terminateRole(e, role)
	during := e.publishMany(6, 4)
	var ready map[string]any
	waitFor(t, 30*time.Second, "/readyz saying the old password is refused", func() bool {
		return getJSON(t, base+"/readyz", &ready) == 503 && strings.Contains(fmt.Sprint(ready["database"]), "28P01")
	})
	// A file that cannot be read is named, as the reason.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "/readyz naming the file", func() bool {
		getJSON(t, base+"/readyz", &ready)
		return strings.Contains(fmt.Sprint(ready["database"]), "DATABASE_URL_FILE: open "+file)
	})
	u, _ := url.Parse(roleURL)
	u.User = url.UserPassword(role, two)
	rewriteSecretFile(t, file, u.String())

	waitFor(t, 60*time.Second, "every event applied after the rotation", func() bool { return e.inboxCount() == len(before)+len(during) })
	waitFor(t, 20*time.Second, "ready again", func() bool { return getJSON(t, base+"/readyz", &ready) == 200 })
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	e.checkExactlyOnce(append(before, during...))
	proc.checkNoSecret(one, two)
}

// AMQP_URL_FILE is read again at each connect: the broker user's password
// is changed and the service's connection closed, the service is refused,
// and once the file is rewritten it consumes again, without a restart. The
// dead-letter connection, dialled at the first dead letter, reads the
// file too.
func TestBrokerPasswordRotatedInTheFile(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	user := e.name + "_svc"
	one, two, three := "pw-one-"+randomSuffix(), "pw-two-"+randomSuffix(), "pw-three-"+randomSuffix()
	setPassword := func(pw string) {
		mgmt(t, http.MethodPut, "/api/users/"+url.PathEscape(user), map[string]string{"password": pw, "tags": ""}, nil)
	}
	setPassword(one)
	t.Cleanup(func() { shared.mgmtQuiet(http.MethodDelete, "/api/users/"+url.PathEscape(user)) })
	mgmt(t, http.MethodPut, "/api/permissions/"+url.PathEscape(e.vhost)+"/"+url.PathEscape(user),
		map[string]string{"configure": ".*", "write": ".*", "read": ".*"}, nil)
	brokerURL := func(pw string) string {
		u, _ := url.Parse(e.amqpURL)
		u.User = url.UserPassword(user, pw)
		return u.String()
	}

	file := writeSecretFile(t, brokerURL(one))
	instance := e.name + "-svc"
	proc := startProcess(t, e.serviceEnv(2, "AMQP_URL=", "AMQP_URL_FILE="+file, "INSTANCE_NAME="+instance))
	proc.waitConsuming(1)
	base := proc.httpAddr()
	before := e.publishMany(4, 4)
	waitFor(t, 30*time.Second, "the events before the rotation applied", func() bool { return e.inboxCount() == len(before) })

	setPassword(two)
	e.closeConnections(instance)
	var ready map[string]any
	waitFor(t, 30*time.Second, "/readyz saying the broker refused the old password", func() bool {
		return getJSON(t, base+"/readyz", &ready) == 503 && strings.Contains(fmt.Sprint(ready["broker"]), "403")
	})
	during := e.publishMany(6, 4)
	rewriteSecretFile(t, file, brokerURL(two))
	waitFor(t, 60*time.Second, "every event applied after the rotation", func() bool { return e.inboxCount() == len(before)+len(during) })
	waitFor(t, 20*time.Second, "ready again", func() bool { return getJSON(t, base+"/readyz", &ready) == 200 })

	// Rotated again while the session lasts: the dead-letter connection,
	// dialled only now, must use the new password to publish the copy.
	setPassword(three)
	rewriteSecretFile(t, file, brokerURL(three))
	e.publishRaw(prefix, "acc_00_"+e.name, []byte(`{"eventId": "not json`), "")
	waitFor(t, 30*time.Second, "the poison message dead-lettered", func() bool { return proc.count("outcome", "dead_lettered") == 1 })
	letters := e.peekDLQ()
	if len(letters) != 1 || letters[0].header("x-failure-class") != "poison" {
		t.Errorf("DLQ holds %v, want the service's copy of the poison message (class poison)", letters)
	}
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	e.checkBalances(append(before, during...))
	proc.checkNoSecret(one, two, three)
}

// useEmptyDatabase points e at an empty database of the test's own in
// place of the one newEnv migrated, so that the owner's migrate makes its
// schema. It returns its URL as the superuser, who owns it.
func (e *env) useEmptyDatabase() string {
	e.t.Helper()
	name := e.name + "_own"
	admin := sqlx.MustOpen("postgres", e.b.databaseURL)
	e.t.Cleanup(func() { admin.Close() })
	admin.MustExec("CREATE DATABASE " + pq.QuoteIdentifier(name))
	e.t.Cleanup(func() { admin.Exec("DROP DATABASE IF EXISTS " + pq.QuoteIdentifier(name) + " WITH (FORCE)") })
	u, _ := url.Parse(e.b.databaseURL)
	u.Path = "/" + name
	e.dbURL = u.String()
	e.db.Close() // newEnv's; the harness closes the one it finds at the end
	e.db = sqlx.MustOpen("postgres", e.dbURL)
	return e.dbURL
}

// lockDown does to e's database what a locked-down estate does beyond
// PostgreSQL 15's defaults (which already grant no CREATE on schema
// public): PUBLIC may not connect, use the schema, or execute the
// functions created from now on.
func (e *env) lockDown() {
	e.t.Helper()
	var name string
	if err := e.db.Get(&name, `SELECT current_database()`); err != nil {
		e.t.Fatal(err)
	}
	e.db.MustExec("REVOKE CONNECT, TEMPORARY ON DATABASE " + pq.QuoteIdentifier(name) + " FROM PUBLIC")
	e.db.MustExec("REVOKE ALL ON SCHEMA public FROM PUBLIC")
	e.db.MustExec("ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC")
}

// serviceRole creates a login role with no privilege, as an estate's
// service account starts, with password when it is not "", and returns
// its name and a URL to e's database as that role. It is dropped at the
// end, with what was granted to it.
func (e *env) serviceRole(password string) (string, string) {
	e.t.Helper()
	role := e.name + "_svc"
	create := "CREATE ROLE " + pq.QuoteIdentifier(role) + " LOGIN"
	if password != "" {
		create += " PASSWORD " + pq.QuoteLiteral(password)
	}
	admin := sqlx.MustOpen("postgres", e.b.databaseURL)
	e.t.Cleanup(func() { admin.Close() })
	admin.MustExec(create)
	e.t.Cleanup(func() {
		terminateRole(e, role)
		e.db.Exec("DROP OWNED BY " + pq.QuoteIdentifier(role))
		admin.Exec("DROP ROLE IF EXISTS " + pq.QuoteIdentifier(role))
	})
	u, _ := url.Parse(e.dbURL)
	u.User = url.User(role)
	if password != "" {
		u.User = url.UserPassword(role, password)
	}
	return role, u.String()
}

// terminateRole ends the sessions of role, as a DBA does after changing
// its password: the service must open new ones.
func terminateRole(e *env, role string) {
	e.db.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, role)
}

// checkPasswords makes the server ask every role but the superuser for
// its password (SCRAM), as an estate's does, and reloads it.
func (c *pgCluster) checkPasswords() {
	c.t.Helper()
	hba := "local all all trust\nhost all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
	if err := os.WriteFile(filepath.Join(c.dir, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		c.t.Fatal(err)
	}
	c.run("pg_ctl", "-D", c.dir, "reload")
}

// waitRefused waits until the server refuses role a wrong password: the
// reload that asks for passwords has taken effect.
func (c *pgCluster) waitRefused(e *env, role, wrong string) {
	c.t.Helper()
	u, _ := url.Parse(e.dbURL)
	u.User = url.UserPassword(role, wrong)
	waitFor(c.t, 30*time.Second, "the server to check passwords", func() bool {
		d, err := sqlx.Open("postgres", u.String())
		if err != nil {
			return false
		}
		defer d.Close()
		err = d.Ping()
		return err != nil && strings.Contains(err.Error(), "28P01")
	})
}

// writeSecretFile writes content to a file readable by its owner alone,
// as a mounted secret is, and returns its path.
func writeSecretFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "url")
	if err := os.WriteFile(path, []byte(content+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// rewriteSecretFile replaces path's content at once, as Kubernetes updates
// a mounted secret: written aside, then renamed over it.
func rewriteSecretFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(content+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// runCommand runs the service binary with args and the environment plus
// env, and returns its output.
func runCommand(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	c := exec.Command(buildService(t), args...)
	c.Env = append(os.Environ(), env...)
	out, err := c.CombinedOutput()
	return string(out), err
}

// checkNoSecret fails the test if any log line holds one of secrets.
func (p *process) checkNoSecret(secrets ...string) {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, line := range p.lines {
		for _, s := range secrets {
			if strings.Contains(fmt.Sprint(line), s) {
				p.t.Errorf("a log line holds a password: %v", line)
			}
		}
	}
}
