// Package dbtest gives tests of more than one package a PostgreSQL of
// their own: a database made for the test and dropped at its end, and a
// service role as an estate's starts. It imports nothing of the service,
// so that db's own tests use it as reconcile's do; tests open and migrate
// the database with the API they test.
//
// The server is TEST_DATABASE_URL (a maintenance database there, as a
// superuser), or the local one. A test is skipped when it is unreachable,
// except with CI=true, where it fails.
package dbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// AdminURL is the test server's maintenance database.
func AdminURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// Admin returns a pool on the test server's maintenance database, closed
// at the end of the test.
func Admin(t testing.TB) *sqlx.DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	admin, err := sqlx.Open("postgres", AdminURL())
	if err == nil {
		err = admin.PingContext(ctx)
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no database (CI=true, so this fails): %v", err)
		}
		t.Skipf("no database: %v", err)
	}
	admin.SetMaxOpenConns(2)
	t.Cleanup(func() { admin.Close() })
	return admin
}

// Create makes an empty database of the test's own, dropped at the end
// of the test (WITH (FORCE): the test's pools may still be open), and
// returns its URL as the superuser.
func Create(t testing.TB) string {
	t.Helper()
	admin := Admin(t)
	name := "tc_db_" + random(6)
	if _, err := admin.Exec("CREATE DATABASE " + pq.QuoteIdentifier(name)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec("DROP DATABASE IF EXISTS " + pq.QuoteIdentifier(name) + " WITH (FORCE)") })
	u, err := url.Parse(AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// ServiceRole creates a login role with no privilege at all, as an
// estate's service account starts, and returns its name and a pool on the
// database of dbURL as that role. The role is dropped at the end, with
// whatever was granted to it there (owner, a pool as the database's owner,
// drops what it owns).
func ServiceRole(t testing.TB, dbURL string, owner *sqlx.DB) (string, *sqlx.DB) {
	t.Helper()
	admin := Admin(t)
	role := "tc_svc_" + random(4)
	if _, err := admin.Exec("CREATE ROLE " + pq.QuoteIdentifier(role) + " LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, role)
		_, _ = owner.Exec("DROP OWNED BY " + pq.QuoteIdentifier(role))
		_, _ = admin.Exec("DROP ROLE IF EXISTS " + pq.QuoteIdentifier(role))
	})
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	as, err := sqlx.Open("postgres", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { as.Close() })
	return role, as
}

// LockDown does to a database what a locked-down estate does beyond
// PostgreSQL 15's defaults (which already grant no CREATE on schema
// public): PUBLIC may not connect, use the schema, or execute the
// functions created from now on.
func LockDown(t testing.TB, owner *sqlx.DB) {
	t.Helper()
	var name string
	if err := owner.Get(&name, `SELECT current_database()`); err != nil {
		t.Fatal(err)
	}
	owner.MustExec("REVOKE CONNECT, TEMPORARY ON DATABASE " + pq.QuoteIdentifier(name) + " FROM PUBLIC")
	owner.MustExec("REVOKE ALL ON SCHEMA public FROM PUBLIC")
	owner.MustExec("ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC")
}

// random is n random bytes in hex, for names of the test's own.
func random(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
