package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode"

	"transferconsumer/db"
)

// secretOf makes a password that no other part of a fuzzed setting is
// likely to spell by chance: a fixed stem and the fuzzer's letters and
// digits.
func secretOf(s string) string {
	var b strings.Builder
	b.WriteString("Pw9x")
	for _, r := range s {
		if r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r)) {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// FuzzDatabaseURL holds DATABASE_URL's reading to three properties, for
// any setting in either of libpq's forms, one host or several: nothing
// panics; no error and no redacted form quotes the password; and a
// setting that is accepted reads back the same from the keyword form the
// driver is given (its hosts, ports, database, user and password).
func FuzzDatabaseURL(f *testing.F) {
	for _, seed := range []struct{ hosts, database, query, password string }{
		{"localhost:5432", "transfers", "sslmode=disable", "secret"},
		{"127.0.0.1:5432,127.0.0.1:5433", "transfers", "sslmode=disable&target_session_attrs=read-write", "pw"},
		{"h1,h2", "db", "port=5432,5433", "x"},
		{"[::1]:5432", "t", "sslmode=verify-full&sslrootcert=/etc/ca.pem", "p"},
		{"db:5432", "transfers", "connect_timeout=5&application_name=a b", "p"},
		{"", "transfers", "host=/var/run/postgresql", "p"},
		{"h1:99999", "d", "", "p"},
		{"h1:,h2:", "d", "", "p"},
		{"a@b:1", "d%2Fx", "x=%zz", "p"},
	} {
		f.Add(seed.hosts, seed.database, seed.query, seed.password, false)
		f.Add(seed.hosts, seed.database, seed.query, seed.password, true)
	}
	f.Fuzz(func(t *testing.T, hosts, database, query, password string, keywords bool) {
		secret := secretOf(password)
		for _, part := range []string{hosts, database, query} {
			if strings.Contains(part, "Pw9x") {
				t.Skip("the fuzzed text spells the password's stem")
			}
		}
		setting := "postgres://svc:" + secret + "@" + hosts + "/" + database
		if query != "" {
			setting += "?" + query
		}
		if keywords {
			setting = "host=" + hosts + " password=" + secret + " user=svc dbname=" + database + " " + query
		}
		if r := Redact(setting); strings.Contains(r, secret) {
			t.Fatalf("Redact(%q) = %q: quotes the password", setting, r)
		}
		got, err := Config{DatabaseURL: setting}.Database()
		if err != nil {
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("Database() of %q: %v: quotes the password", setting, err)
			}
			return
		}
		if got != setting {
			t.Fatalf("Database() = %q, want the setting %q as it is", got, setting)
		}
		dsn, err := db.ParseDSN(setting)
		if err != nil {
			t.Fatalf("accepted, but ParseDSN(%q) fails: %v", setting, err)
		}
		// Only where the setting's reading took it for the password: in
		// "host= password=…" libpq, and so this reading, give host the
		// value "password=…".
		if r := dsn.Redacted(); dsn.Get("password") == secret && strings.Contains(r, secret) {
			t.Fatalf("DSN.Redacted() = %q: quotes the password", r)
		}
		again, err := db.ParseDSN(dsn.Driver())
		if err != nil {
			t.Fatalf("the driver's form of %q does not parse again: %v", setting, err)
		}
		for _, key := range []string{"host", "port", "dbname", "user", "password"} {
			if a, b := dsn.Get(key), again.Get(key); a != b {
				t.Fatalf("%s of %q is %q, but %q in the driver's form %q", key, setting, a, b, dsn.Driver())
			}
		}
	})
}

// FuzzSecretFile holds the *_FILE reading to its promises for any file
// content: it returns the content without the blanks around it, or an
// error that names the variable and never quotes the content.
func FuzzSecretFile(f *testing.F) {
	for _, seed := range []string{
		"postgres://svc:secret@db:5432/transfers?sslmode=disable\n",
		"  host=h1,h2 port=5432,5433 password=secret dbname=t  \r\n",
		"", "\n\n", "\x00\xff", strings.Repeat("x", 100),
	} {
		f.Add(seed)
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, content string) {
		file := filepath.Join(dir, "secret")
		if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		value, name, err := fromFile("DATABASE_URL", "", file)
		if !strings.HasPrefix(name, "DATABASE_URL_FILE") {
			t.Fatalf("named %q, want DATABASE_URL_FILE", name)
		}
		trimmed := strings.TrimSpace(content)
		if err != nil {
			if !strings.Contains(err.Error(), "DATABASE_URL_FILE") {
				t.Fatalf("error %q does not name the variable", err)
			}
			if len(trimmed) >= 8 && strings.Contains(err.Error(), trimmed) {
				t.Fatalf("error %q quotes the file's content", err)
			}
			if trimmed != "" && len(content) <= maxSecretFile {
				t.Fatalf("a readable, non-empty file of %d bytes was refused: %v", len(content), err)
			}
			return
		}
		if value != trimmed || value == "" || len(content) > maxSecretFile {
			t.Fatalf("fromFile read %q from %q", value, content)
		}
	})
}
