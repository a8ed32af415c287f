package db

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"transferconsumer/retry"
)

// Both of libpq's forms, with one host or several, reach lib/pq as the
// keyword form it reads right, host and port lists of the same length.
func TestParseDSN(t *testing.T) {
	tests := []struct {
		in, driver string
		hosts      []string
		dbname     string
	}{
		{"postgres://postgres@localhost:5432/transfers?sslmode=disable",
			"user='postgres' host='localhost' port='5432' dbname='transfers' sslmode='disable'",
			[]string{"localhost:5432"}, "transfers"},
		{"postgres://u@h1:5432,h2:5433/db?sslmode=disable&target_session_attrs=read-write",
			"user='u' host='h1,h2' port='5432,5433' dbname='db' sslmode='disable' target_session_attrs='read-write'",
			[]string{"h1:5432", "h2:5433"}, "db"},
		{"postgresql://u:p%40ss@h1,h2:6000/db",
			"user='u' password='p@ss' host='h1,h2' port='5432,6000' dbname='db'",
			[]string{"h1:5432", "h2:6000"}, "db"},
		{"postgres://u@h1,h2/db?port=5432,5433",
			"user='u' host='h1,h2' dbname='db' port='5432,5433'",
			[]string{"h1:5432", "h2:5433"}, "db"},
		{"postgres://u@[::1]:5432,[fe80::2]:5433/d%20b",
			"user='u' host='::1,fe80::2' port='5432,5433' dbname='d b'",
			[]string{"[::1]:5432", "[fe80::2]:5433"}, "d b"},
		{"postgres://h/db?application_name=a&application_name=b",
			"host='h' dbname='db' application_name='b'",
			[]string{"h"}, "db"},
		{"host=h1,h2 port=5432,5433 user=u dbname=db target_session_attrs=read-write",
			"host='h1,h2' port='5432,5433' user='u' dbname='db' target_session_attrs='read-write'",
			[]string{"h1:5432", "h2:5433"}, "db"},
		{"  host = h\tpassword='' dbname=x ", "host='h' password='' dbname='x'", []string{"h"}, "x"},
		{`host=h password='a \'b\' c\\' sslmode=require`,
			`host='h' password='a \'b\' c\\' sslmode='require'`, []string{"h"}, ""},
		{`host=h password=s\ 3`, `host='h' password='s 3'`, []string{"h"}, ""},
		{"dbname=x port=6432", "dbname='x' port='6432'", []string{}, "x"},
	}
	for _, tt := range tests {
		d, err := ParseDSN(tt.in)
		if err != nil {
			t.Errorf("ParseDSN(%q): %v", tt.in, err)
			continue
		}
		if got := d.Driver(); got != tt.driver {
			t.Errorf("ParseDSN(%q).Driver() =\n %s\nwant\n %s", tt.in, got, tt.driver)
		}
		if got := d.Hosts(); !slices.Equal(got, tt.hosts) {
			t.Errorf("ParseDSN(%q).Hosts() = %q, want %q", tt.in, got, tt.hosts)
		}
		if got := d.Get("dbname"); got != tt.dbname {
			t.Errorf("ParseDSN(%q) dbname = %q, want %q", tt.in, got, tt.dbname)
		}
		// What Driver writes reads back the same.
		again, err := ParseDSN(d.Driver())
		if err != nil || again.Driver() != d.Driver() {
			t.Errorf("ParseDSN(%q) read back as %q, %v", d.Driver(), again.Driver(), err)
		}
	}
}

// A setting in neither form, or that does not parse, is an error that
// quotes no password.
func TestParseDSNRefuses(t *testing.T) {
	tests := []struct {
		in      string
		notPG   bool
		without string
	}{
		{"mysql://u:s3cret@h/db", true, "s3cret"},
		{"s3cret", true, "s3cret"},
		{"", true, ""},
		{"   ", true, ""},
		{"host=h password='s3cret", false, "s3cret"},
		{"host=h s3cret", false, "s3cret"},
		{"=s3cret", false, "s3cret"},
		{"host=h password='it''s3cret'", false, "s3cret"}, // '' is no escape, as in libpq
		{"postgres://u:s3cret@h1:5432,/db", false, "s3cret"},
		{"postgres://u:s3cret@h1,h2:x/db", false, "s3cret"},
	}
	for _, tt := range tests {
		_, err := ParseDSN(tt.in)
		if err == nil {
			t.Errorf("ParseDSN(%q) = nil error", tt.in)
			continue
		}
		if errors.Is(err, ErrNotPostgres) != tt.notPG {
			t.Errorf("ParseDSN(%q) = %v, want ErrNotPostgres: %v", tt.in, err, tt.notPG)
		}
		msg := err.Error()
		var ue *url.Error
		if errors.As(err, &ue) {
			msg = ue.Err.Error() // what the service shows: url.Error's own text quotes the URL
		}
		if tt.without != "" && strings.Contains(msg, tt.without) {
			t.Errorf("ParseDSN(%q) = %q: shows the password", tt.in, msg)
		}
	}
}

// Redacted keeps the form given and hides every secret; With rewrites one
// parameter, in either form.
func TestDSNRedactedAndWith(t *testing.T) {
	tests := []struct{ in, redacted, postgres string }{
		{"postgres://u:s3cret@h1:5432,h2:5433/db?sslmode=disable&target_session_attrs=read-write",
			"postgres://u:xxxxx@h1:5432,h2:5433/db?sslmode=disable&target_session_attrs=read-write",
			"postgres://u:xxxxx@h1:5432,h2:5433/postgres?sslmode=disable&target_session_attrs=read-write"},
		{"postgres://u@h/db?sslpassword=s3cret&password=s3cret",
			"postgres://u:xxxxx@h/db?sslpassword=xxxxx",
			"postgres://u:xxxxx@h/postgres?sslpassword=xxxxx"},
		{"host=h1,h2 port=5432,5433 user=u password='s3 cret' dbname=db",
			"host=h1,h2 port=5432,5433 user=u password=xxxxx dbname=db",
			"host=h1,h2 port=5432,5433 user=u password=xxxxx dbname=postgres"},
		{"host=h user=u", "host=h user=u", "host=h user=u dbname=postgres"},
	}
	for _, tt := range tests {
		d, err := ParseDSN(tt.in)
		if err != nil {
			t.Fatalf("ParseDSN(%q): %v", tt.in, err)
		}
		if got := d.Redacted(); got != tt.redacted {
			t.Errorf("Redacted(%q) =\n %s\nwant\n %s", tt.in, got, tt.redacted)
		}
		if got := d.With("dbname", "postgres").Redacted(); got != tt.postgres {
			t.Errorf("With(dbname, postgres) of %q =\n %s\nwant\n %s", tt.in, got, tt.postgres)
		}
		if d.Get("dbname") == "postgres" {
			t.Errorf("With changed the original")
		}
		if strings.Contains(d.Redacted(), "s3") {
			t.Errorf("Redacted(%q) shows the password", tt.in)
		}
	}
}

// Against the local server: both forms connect when the first host listed
// refuses, target_session_attrs=read-write passes the primary, and a
// missing database is created on it.
func TestOpenSeveralHosts(t *testing.T) {
	testDB(t, 1) // skips, or fails with CI=true, without a server
	adminURL := os.Getenv("TEST_DATABASE_URL")
	if adminURL == "" {
		adminURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	u, err := url.Parse(adminURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a port nothing answers on once closed
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	deadHost, deadPort, _ := net.SplitHostPort(dead)
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "5432"
	}
	user := u.User.Username()
	for i, keyword := range []bool{false, true} {
		// A database of its own, which OpenWhenReady creates through the
		// maintenance database of the same hosts.
		name := fmt.Sprintf("tc_hosts_%d_%d", i, time.Now().UnixNano())
		dsn := fmt.Sprintf("postgres://%s@%s,%s:%s/%s?sslmode=disable&target_session_attrs=read-write", user, dead, host, port, name)
		if keyword {
			dsn = fmt.Sprintf("host=%s,%s port=%s,%s user=%s dbname=%s sslmode=disable target_session_attrs=read-write",
				deadHost, host, deadPort, port, user, name)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		log, _ := captureLog()
		database, err := OpenWhenReady(ctx, func() (string, error) { return dsn, nil }, true, 1,
			retry.Backoff{Min: 10 * time.Millisecond, Max: 100 * time.Millisecond}, log, nil)
		cancel()
		t.Cleanup(func() {
			if admin, err := Open(context.Background(), adminURL, 1); err == nil {
				admin.Exec(`DROP DATABASE IF EXISTS ` + name + ` WITH (FORCE)`)
				admin.Close()
			}
		})
		if err != nil {
			t.Errorf("OpenWhenReady(%q): %v", dsn, err)
			continue
		}
		var current string
		if err := database.Get(&current, `SELECT current_database()`); err != nil || current != name {
			t.Errorf("%q: connected to %q, %v", dsn, current, err)
		}
		database.Close()
	}
}
