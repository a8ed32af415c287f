package db

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jmoiron/sqlx"

	"transferconsumer/dbtest"
	"transferconsumer/retry"
)

// freshDB makes an empty database of the test's own, dropped at the end,
// and returns its URL as the superuser and a pool on it.
func freshDB(t *testing.T) (string, *sqlx.DB) {
	t.Helper()
	dbURL := dbtest.Create(t)
	database, err := Open(context.Background(), dbURL, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { database.Close() })
	return dbURL, database
}

// A schema that is current is checked by reading alone: a role that may
// only read and write data starts, where Migrate, which every start ran
// before, is refused it.
func TestCurrentSchemaNeedsNoPrivilegeBeyondData(t *testing.T) {
	dbURL, owner := freshDB(t)
	ctx := context.Background()
	migrations := os.DirFS("../sql")
	all := everyFile(t, migrations)

	missing, err := Pending(ctx, owner, migrations)
	if err != nil || len(missing) != len(all) {
		t.Fatalf("Pending on an empty database = %v, %v, want all %d", missing, err, len(all))
	}
	var exists bool
	owner.Get(&exists, `SELECT to_regclass('schema_migration') IS NOT NULL`)
	if exists {
		t.Fatal("Pending created schema_migration")
	}
	if _, err := Migrate(ctx, owner, migrations); err != nil {
		t.Fatal(err)
	}
	role, svc := dbtest.ServiceRole(t, dbURL, owner)
	dbtest.LockDown(t, owner)
	if err := Grant(ctx, owner, role); err != nil {
		t.Fatal(err)
	}

	if missing, err := Pending(ctx, svc, migrations); err != nil || len(missing) != 0 {
		t.Errorf("Pending as %s = %v, %v, want none", role, missing, err)
	}
	if _, err := Migrate(ctx, svc, migrations); !Refused(err) {
		t.Errorf("Migrate as %s = %v, want it refused (42501): the role may not create in the schema", role, err)
	}
	log, logs := captureLog()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var once sync.Once
	if err := SchemaWhenReady(ctx, svc, migrations, true, retry.Backoff{Min: time.Millisecond, Max: time.Millisecond}, log,
		func(err error) { once.Do(func() { t.Errorf("waited: %v", err); cancel() }) }); err != nil {
		t.Errorf("SchemaWhenReady as %s = %v, want nil at once", role, err)
	}
	if logs.String() != "" {
		t.Errorf("logged on a current schema:\n%s", logs.String())
	}
}

// Grant gives the service's role what it needs, and the same on what a
// later migration creates: a table with a sequence, a function, a
// function dropped and created again. It gives nothing that changes the
// schema, and of schema_migration only reading.
func TestGrantReachesWhatLaterMigrationsCreate(t *testing.T) {
	dbURL, owner := freshDB(t)
	ctx := context.Background()
	dbtest.LockDown(t, owner)
	first := fstest.MapFS{
		"0001_a.sql": {Data: []byte(`CREATE TABLE a (id BIGSERIAL PRIMARY KEY, v TEXT);
			CREATE FUNCTION fa() RETURNS INT LANGUAGE sql AS 'SELECT 1';
			CREATE FUNCTION fk() RETURNS INT LANGUAGE sql AS 'SELECT 1';`)},
	}
	if _, err := Migrate(ctx, owner, first); err != nil {
		t.Fatal(err)
	}
	role, svc := dbtest.ServiceRole(t, dbURL, owner)
	if err := Grant(ctx, owner, role); err != nil {
		t.Fatal(err)
	}
	if err := Grant(ctx, owner, role); err != nil {
		t.Fatalf("Grant again: %v", err)
	}
	later := fstest.MapFS{
		"0001_a.sql": first["0001_a.sql"],
		"0002_b.sql": {Data: []byte(`CREATE TABLE b (id BIGSERIAL PRIMARY KEY, v TEXT);
			CREATE FUNCTION fb() RETURNS INT LANGUAGE sql AS 'SELECT 2';
			DROP FUNCTION fa(); CREATE FUNCTION fa() RETURNS INT LANGUAGE sql AS 'SELECT 3';`)},
	}
	if _, err := Migrate(ctx, owner, later); err != nil {
		t.Fatal(err)
	}

	for _, stmt := range []string{
		`INSERT INTO a (v) VALUES ('x')`, `UPDATE a SET v = 'y'`, `SELECT count(*) FROM a`, `DELETE FROM a`,
		`INSERT INTO b (v) VALUES ('x')`, `UPDATE b SET v = 'y'`, `SELECT count(*) FROM b`, `DELETE FROM b`,
		`SELECT fa()`, `SELECT fb()`, `SELECT fk()`, `SELECT count(*) FROM schema_migration`,
	} {
		if _, err := svc.ExecContext(ctx, stmt); err != nil {
			t.Errorf("as %s, %s: %v", role, stmt, err)
		}
	}
	for _, stmt := range []string{
		`INSERT INTO schema_migration (version, name) VALUES (3, 'x')`, `DELETE FROM schema_migration`,
		`CREATE TABLE c (id INT)`, `DROP TABLE a`, `ALTER TABLE b ADD COLUMN w INT`, `CREATE TEMPORARY TABLE t (id INT)`,
	} {
		if _, err := svc.ExecContext(ctx, stmt); !Refused(err) {
			t.Errorf("as %s, %s: %v, want it refused", role, stmt, err)
		}
	}

	var self string
	owner.Get(&self, `SELECT current_user`)
	if err := Grant(ctx, owner, self); err == nil || !strings.Contains(err.Error(), "the role migrating") {
		t.Errorf("Grant to the owner itself = %v, want it refused", err)
	}
}

// While migrations are missing that the service may not (42501) or will
// not (MIGRATE=false) apply, SchemaWhenReady says which, and that the
// schema's owner must run migrate; it tries to migrate at most once, then
// only checks, and returns once the owner has migrated.
func TestSchemaBehindWaitsForTheOwner(t *testing.T) {
	migrations := os.DirFS("../sql")
	numbered, _ := fs.Glob(migrations, "*.sql")
	last := numbered[len(numbered)-1]
	all := everyFile(t, migrations)
	tests := []struct {
		name    string
		migrate bool
		setup   func(t *testing.T, dbURL string, owner *sqlx.DB) *sqlx.DB // returns the service's pool
		missing []string
		want    []string // in the reason
	}{
		{"the role may not migrate", true, func(t *testing.T, dbURL string, owner *sqlx.DB) *sqlx.DB {
			if _, err := Migrate(context.Background(), owner, migrations); err != nil {
				t.Fatal(err)
			}
			role, svc := dbtest.ServiceRole(t, dbURL, owner)
			if err := Grant(context.Background(), owner, role); err != nil {
				t.Fatal(err)
			}
			owner.MustExec(`DELETE FROM schema_migration WHERE name = $1`, last)
			return svc
		}, []string{last}, []string{"lacks migration(s) " + last, "may not change the schema", "permission denied", "(42501)",
			"the schema's owner must run `transferconsumer migrate`"}},
		{"MIGRATE=false, though the role may", false, func(t *testing.T, dbURL string, owner *sqlx.DB) *sqlx.DB {
			return owner
		}, all, []string{"lacks migration(s) " + strings.Join(all, ", "), "MIGRATE=false",
			"the schema's owner must run `transferconsumer migrate`"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dbURL, owner := freshDB(t)
			svc := tt.setup(t, dbURL, owner)
			log, logs := captureLog()
			var checks atomic.Int32
			var mu sync.Mutex
			var told error
			done := make(chan error, 1)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() {
				done <- SchemaWhenReady(ctx, svc, migrations, tt.migrate, retry.Backoff{Min: time.Millisecond, Max: 5 * time.Millisecond}, log,
					func(err error) {
						mu.Lock()
						told = err
						mu.Unlock()
						checks.Add(1)
					})
			}()
			waitFor(t, 20*time.Second, "five checks of the schema", func() bool { return checks.Load() >= 5 })
			mu.Lock()
			err := told
			mu.Unlock()
			var behind *Behind
			if !errors.As(err, &behind) || strings.Join(behind.Missing, ",") != strings.Join(tt.missing, ",") {
				t.Fatalf("waiting was told %v, want a *Behind missing %v", err, tt.missing)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the reason does not say %q: %v", w, err)
				}
			}
			if n := strings.Count(logs.String(), "the database refused the service's migration"); tt.migrate && n != 1 {
				t.Errorf("the refusal logged %d times in %d checks, want once: it tries to migrate only once", n, checks.Load())
			}
			if !tt.migrate && strings.Contains(logs.String(), "refused") {
				t.Errorf("with MIGRATE=false it tried to migrate:\n%s", logs.String())
			}
			var exists bool
			owner.Get(&exists, `SELECT to_regclass('schema_migration') IS NOT NULL`)
			if !tt.migrate && exists {
				t.Error("with MIGRATE=false schema_migration was created")
			}

			if _, err := Migrate(context.Background(), owner, migrations); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("after the owner migrated: %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the owner's migration was not picked up")
			}
			if !strings.Contains(logs.String(), "the schema is current") {
				t.Errorf("the end of the wait was not logged:\n%s", logs.String())
			}
		})
	}
}

// A role that may not even read schema_migration is told how to get what
// it needs.
func TestSchemaUnreadableNamesTheGrant(t *testing.T) {
	dbURL, owner := freshDB(t)
	if _, err := Migrate(context.Background(), owner, os.DirFS("../sql")); err != nil {
		t.Fatal(err)
	}
	role, svc := dbtest.ServiceRole(t, dbURL, owner)
	told := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log, _ := captureLog()
	go SchemaWhenReady(ctx, svc, os.DirFS("../sql"), true, retry.Backoff{Min: time.Millisecond, Max: time.Millisecond}, log,
		func(err error) {
			select {
			case told <- err:
			default:
			}
		})
	select {
	case err := <-told:
		if !Refused(err) || !strings.Contains(err.Error(), "`transferconsumer migrate --grant-to "+role+"`") {
			t.Errorf("got %v, want a 42501 naming migrate --grant-to %s", err, role)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("never told")
	}
}

// The pool asks its Source for the URL at each new connection, so that a
// rewritten secret file is used from the next one on; the Source's error
// is the pool's.
func TestOpenFromAsksTheSourceForEachConnection(t *testing.T) {
	dbtest.Admin(t)
	var calls atomic.Int32
	src := func() (string, error) {
		n := calls.Add(1)
		u, _ := url.Parse(dbtest.AdminURL())
		q := u.Query()
		q.Set("application_name", "tc_source_"+string(rune('a'+n%26)))
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	database, err := OpenFrom(context.Background(), src, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer database.Close()
	database.SetMaxIdleConns(0) // each connection is closed once used
	names := map[string]bool{}
	for range 3 {
		var name string
		if err := database.Get(&name, `SELECT current_setting('application_name')`); err != nil {
			t.Fatal(err)
		}
		names[name] = true
	}
	if len(names) != 3 {
		t.Errorf("three connections ran as %v: the source was not asked for each", names)
	}

	_, err = OpenFrom(context.Background(), func() (string, error) {
		return "", errors.New("DATABASE_URL_FILE (/run/secrets/db): empty")
	}, 1)
	if err == nil || !strings.Contains(err.Error(), "DATABASE_URL_FILE (/run/secrets/db): empty") {
		t.Errorf("OpenFrom = %v, want the source's error", err)
	}
}

// lib/pq's reason for refusing a URL is kept unless it quotes a password.
func TestReasonWithoutSecret(t *testing.T) {
	tests := []struct{ err, dsn, want string }{
		{`pq: unsupported sslmode "bogus"`, "postgres://u:s3cret@h/db?sslmode=bogus", `: pq: unsupported sslmode "bogus"`},
		{`parse "postgres://u:s3cret@h/db": bad`, "postgres://u:s3cret@h/db", ""},
		{`bad value s3 cret`, "postgres://u:s3%20cret@h/db", ""},
		{`bad value s3cret`, "postgres://u@h/db?password=s3cret", ""},
		{`missing "=" after "s3cret"`, "host=h password=s3cret", ""},
	}
	for _, tt := range tests {
		if got := reasonWithoutSecret(errors.New(tt.err), tt.dsn); got != tt.want {
			t.Errorf("reasonWithoutSecret(%q) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

// captureLog returns a logger and what it wrote.
func captureLog() (*slog.Logger, *lockedBuffer) {
	b := &lockedBuffer{}
	return slog.New(slog.NewTextHandler(b, nil)), b
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
