package config

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestConfigRejectsBadValuesNamingTheVariable(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"QUEUE_COUNT": "0"}, "QUEUE_COUNT"},
		{map[string]string{"QUEUE_COUNT": "many"}, "QUEUE_COUNT"},
		{map[string]string{"AMQP_URL": "http://broker"}, "AMQP_URL"},
		{map[string]string{"AMQP_URL": "amqp://u:s3cret@[::1"}, "AMQP_URL"},
		{map[string]string{"AMQP_URL": "amqp://u:s3cret@node1/, http://node2/"}, "AMQP_URL: URL 2"},
		{map[string]string{"DATABASE_URL": "mysql://db"}, "DATABASE_URL"},
		{map[string]string{"DATABASE_URL": "::"}, "DATABASE_URL"},
		{map[string]string{"DATABASE_URL": "host=h password='s3cret dbname=x"}, "DATABASE_URL"},
		{map[string]string{"DATABASE_URL": "mysql://u@h/db?password=s3cret"}, "DATABASE_URL"},
		{map[string]string{"DELIVERY_LIMIT": "0"}, "DELIVERY_LIMIT"},
		{map[string]string{"MAX_BODY_BYTES": "10"}, "MAX_BODY_BYTES"},
		{map[string]string{"SHUTDOWN_TIMEOUT": "soon"}, "SHUTDOWN_TIMEOUT"},
		{map[string]string{"RETRY_MIN": "5s", "RETRY_MAX": "1s"}, "RETRY_MIN/RETRY_MAX"},
		{map[string]string{"TOPOLOGY_PREFIX": ""}, "TOPOLOGY_PREFIX"},
		{map[string]string{"LOG_LEVEL": "loud"}, `LOG_LEVEL: must be debug, info, warn or error, got "loud"`},
		{map[string]string{"LOG_FORMAT": "xml"}, "LOG_FORMAT"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			_, err := Load()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v does not name %s", err, tt.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error leaks the password: %v", err)
			}
		})
	}
}

// Every bounded setting is accepted at its bound and refused one step
// past it, naming the variable.
func TestConfigLimitsAtTheirBoundary(t *testing.T) {
	tests := []struct {
		name     string
		ok, past map[string]string
	}{
		{"QUEUE_COUNT", map[string]string{"QUEUE_COUNT": "1"}, map[string]string{"QUEUE_COUNT": "0"}},
		{"QUEUE_COUNT", map[string]string{"QUEUE_COUNT": "1024"}, map[string]string{"QUEUE_COUNT": "1025"}},
		{"DELIVERY_LIMIT", map[string]string{"DELIVERY_LIMIT": "1"}, map[string]string{"DELIVERY_LIMIT": "0"}},
		{"REPLICA_INDEX/REPLICA_COUNT", map[string]string{"REPLICA_COUNT": "2", "REPLICA_INDEX": "1"},
			map[string]string{"REPLICA_COUNT": "2", "REPLICA_INDEX": "2"}},
		{"REPLICA_INDEX/REPLICA_COUNT", map[string]string{"REPLICA_INDEX": "0"}, map[string]string{"REPLICA_INDEX": "-1"}},
		{"REPLICA_INDEX/REPLICA_COUNT", map[string]string{"REPLICA_COUNT": "1"}, map[string]string{"REPLICA_COUNT": "0"}},
		{"SHUTDOWN_TIMEOUT", map[string]string{"SHUTDOWN_TIMEOUT": "1ns"}, map[string]string{"SHUTDOWN_TIMEOUT": "0s"}},
		{"APPLY_TIMEOUT", map[string]string{"APPLY_TIMEOUT": "1ns"}, map[string]string{"APPLY_TIMEOUT": "0s"}},
		{"RETRY_MIN/RETRY_MAX", map[string]string{"RETRY_MIN": "1s", "RETRY_MAX": "1s"},
			map[string]string{"RETRY_MIN": "1s", "RETRY_MAX": "999999999ns"}},
		{"RETRY_MIN/RETRY_MAX", map[string]string{"RETRY_MIN": "1ns"}, map[string]string{"RETRY_MIN": "0s"}},
		{"RECONNECT_MIN/RECONNECT_MAX", map[string]string{"RECONNECT_MIN": "1s", "RECONNECT_MAX": "1s"},
			map[string]string{"RECONNECT_MIN": "1s", "RECONNECT_MAX": "999999999ns"}},
		{"RECONNECT_MIN/RECONNECT_MAX", map[string]string{"RECONNECT_MIN": "1ns"}, map[string]string{"RECONNECT_MIN": "0s"}},
		{"INBOX_TTL", map[string]string{"INBOX_TTL": "1h"}, map[string]string{"INBOX_TTL": "3599999999999ns"}},
		{"PRUNE_INTERVAL", map[string]string{"PRUNE_INTERVAL": "1ns"}, map[string]string{"PRUNE_INTERVAL": "0s"}},
		{"PRUNE_BATCH", map[string]string{"PRUNE_BATCH": "1"}, map[string]string{"PRUNE_BATCH": "0"}},
		{"PRUNE_BATCH", map[string]string{"PRUNE_BATCH": "100000"}, map[string]string{"PRUNE_BATCH": "100001"}},
		{"RECONCILE_INTERVAL", map[string]string{"RECONCILE_INTERVAL": "0s"}, map[string]string{"RECONCILE_INTERVAL": "-1ns"}},
		{"RECONCILE_WINDOW", map[string]string{"RECONCILE_WINDOW": "1ns"}, map[string]string{"RECONCILE_WINDOW": "0s"}},
		{"RECONCILE_PENDING_AFTER", map[string]string{"RECONCILE_PENDING_AFTER": "1ns"}, map[string]string{"RECONCILE_PENDING_AFTER": "0s"}},
		{"RECONCILE_FULL_INTERVAL", map[string]string{"RECONCILE_FULL_INTERVAL": "0s"}, map[string]string{"RECONCILE_FULL_INTERVAL": "-1ns"}},
		{"RECONCILE_FULL_INTERVAL", map[string]string{"RECONCILE_INTERVAL": "1h", "RECONCILE_FULL_INTERVAL": "1h"},
			map[string]string{"RECONCILE_INTERVAL": "1h", "RECONCILE_FULL_INTERVAL": "59m59s"}},
		{"RECONCILE_DATABASE_URL", map[string]string{"RECONCILE_DATABASE_URL": "postgres://u@standby:5432/transfers"},
			map[string]string{"RECONCILE_DATABASE_URL": "mysql://u@standby/transfers"}},
		{"DB_MAX_CONNS", map[string]string{"DB_MAX_CONNS": "0"}, map[string]string{"DB_MAX_CONNS": "-1"}},
		{"BATCH_MAX", map[string]string{"BATCH_MAX": "1"}, map[string]string{"BATCH_MAX": "0"}},
		{"BATCH_MAX", map[string]string{"BATCH_MAX": "500"}, map[string]string{"BATCH_MAX": "501"}},
		{"MAX_BODY_BYTES", map[string]string{"MAX_BODY_BYTES": "1024"}, map[string]string{"MAX_BODY_BYTES": "1023"}},
		{"MAX_BODY_BYTES", map[string]string{"MAX_BODY_BYTES": "134217728"}, map[string]string{"MAX_BODY_BYTES": "134217729"}},
		{"BATCH_LINGER", map[string]string{"BATCH_LINGER": "0s"}, map[string]string{"BATCH_LINGER": "-1ns"}},
		{"BATCH_LINGER", map[string]string{"BATCH_LINGER": "1s"}, map[string]string{"BATCH_LINGER": "1000000001ns"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			load := func(env map[string]string) error {
				for _, k := range []string{"QUEUE_COUNT", "DELIVERY_LIMIT", "REPLICA_INDEX", "REPLICA_COUNT", "SHUTDOWN_TIMEOUT",
					"APPLY_TIMEOUT", "RETRY_MIN", "RETRY_MAX", "RECONNECT_MIN", "RECONNECT_MAX", "INBOX_TTL",
					"PRUNE_INTERVAL", "PRUNE_BATCH", "RECONCILE_INTERVAL", "RECONCILE_WINDOW", "RECONCILE_PENDING_AFTER",
					"RECONCILE_FULL_INTERVAL", "RECONCILE_DATABASE_URL", "DB_MAX_CONNS", "BATCH_MAX", "MAX_BODY_BYTES", "BATCH_LINGER"} {
					t.Setenv(k, "")
					os.Unsetenv(k)
				}
				for k, v := range env {
					t.Setenv(k, v)
				}
				_, err := Load()
				return err
			}
			if err := load(tt.ok); err != nil {
				t.Errorf("%v: refused at its bound: %v", tt.ok, err)
			}
			if err := load(tt.past); err == nil || !strings.Contains(err.Error(), tt.name) {
				t.Errorf("%v: one step past its bound, the error %v does not name %s", tt.past, err, tt.name)
			}
		})
	}
}

// A value of the wrong form is named with its variable and the form it
// should have, in words, not in envconfig's and strconv's terms.
func TestConfigSaysWhatFormAValueShouldHave(t *testing.T) {
	tests := []struct{ name, value, want string }{
		{"QUEUE_COUNT", "abc", `configuration: QUEUE_COUNT: "abc" is not a whole number`},
		{"QUEUE_COUNT", "", `configuration: QUEUE_COUNT: "" is not a whole number`},
		{"QUEUE_COUNT", "8.5", `configuration: QUEUE_COUNT: "8.5" is not a whole number`},
		{"PRUNE_BATCH", "99999999999999999999", `configuration: PRUNE_BATCH: "99999999999999999999" is out of range`},
		{"SHUTDOWN_TIMEOUT", "soon", `configuration: SHUTDOWN_TIMEOUT: "soon" is not a duration (like 30s or 2m)`},
		{"RETRY_MIN", "100", `configuration: RETRY_MIN: "100" is not a duration (like 30s or 2m)`},
		{"DECLARE_TOPOLOGY", "maybe", `configuration: DECLARE_TOPOLOGY: "maybe" is not true or false`},
		{"PPROF", "yes", `configuration: PPROF: "yes" is not true or false`},
	}
	for _, tt := range tests {
		t.Run(tt.name+"="+tt.value, func(t *testing.T) {
			t.Setenv(tt.name, tt.value)
			_, err := Load()
			if err == nil || err.Error() != tt.want {
				t.Errorf("got  %v\nwant %s", err, tt.want)
			}
		})
	}
}

// A URL that does not parse is not quoted back: it may hold a password, and
// url.Parse's error quotes all of it. The reason is kept, without any piece
// of a password in it.
func TestConfigURLErrorsSayWhyWithoutTheURL(t *testing.T) {
	const encode = "; a / ? # @ % , or blank in a password must be percent-encoded"
	tests := []struct{ name, value, want string }{
		{"DATABASE_URL", "postgres://u:s3cret@h:x/db", `DATABASE_URL: not a URL (invalid port ":x" after host)`},
		{"DATABASE_URL", "postgres://u:s3cret@[::1/db", `DATABASE_URL: not a URL (missing ']' in host)`},
		{"DATABASE_URL", "postgres://u:s3/cret@h/db", `DATABASE_URL: not a URL (invalid port after host` + encode + `)`},
		{"DATABASE_URL", "postgres://u:s3%cret@h/db", `DATABASE_URL: not a URL (invalid URL escape` + encode + `)`},
		{"DATABASE_URL", "postgres://u:s3 cret@h/db", `DATABASE_URL: not a URL (net/url: invalid userinfo` + encode + `)`},
		{"DATABASE_URL", "postgres://u@h:x/db?password=s3cret", `DATABASE_URL: not a URL (invalid port ":x" after host)`},
		{"DATABASE_URL", "::", `DATABASE_URL: not a URL (missing protocol scheme)`},
		{"DATABASE_URL", "mysql://u:s3cret@h/db?password=s3cret",
			`DATABASE_URL: want postgres://user@host:port/database?sslmode=…, got "mysql://u:xxxxx@h/db?password=xxxxx"`},
		{"DATABASE_URL", "host=h password='s3 cret dbname=x",
			`DATABASE_URL: not a connection string (the value of password has no closing quote)`},
		{"DATABASE_URL", "postgres://u:s3cret@h1:5432,/db", `DATABASE_URL: not a URL (host 2 of 2 is empty)`},
		{"AMQP_URL", "amqp://u:s3cret@[::1", `AMQP_URL: not a URL (missing ']' in host)`},
		{"AMQP_URL", "amqp://u:s3/cret@h/", `AMQP_URL: not a URL (invalid port after host` + encode + `)`},
		{"AMQP_URL", "amqp://u:s3cret@n1/, amqp://u:s3cret@n2:x/", `AMQP_URL: URL 2: not a URL (invalid port ":x" after host)`},
		{"AMQP_URL", "amqp://u:s3cret@n1/, http://n2/",
			`AMQP_URL: URL 2: not an AMQP URL (AMQP scheme must be either 'amqp://' or 'amqps://')`},
		// A comma in a password splits the list inside the userinfo.
		{"AMQP_URL", "amqp://u:s3,cret@n1/", `AMQP_URL: URL 1: not a URL (invalid port after host` + encode + `)`},
		{"AMQP_URL", "amqp://u:99999999999,s3cret@n1/",
			`AMQP_URL: URL 1: not an AMQP URL (strconv.ParseInt: parsing: value out of range` + encode + `)`},
		{"MANAGEMENT_URL", "amqp://u:s3cret@h:15672", `MANAGEMENT_URL: want http[s]://[user:password@]host:port, got "amqp://u:xxxxx@h:15672"`},
		{"MANAGEMENT_URL", "http://u:s3/cret@h:15672", `MANAGEMENT_URL: not a URL (invalid port after host` + encode + `)`},
		{"MANAGEMENT_URL", "https://u:s3cret@h:15672/?x=1", `MANAGEMENT_URL: want http[s]://[user:password@]host:port, got "https://u:xxxxx@h:15672/?x=1"`},
	}
	for _, tt := range tests {
		t.Run(tt.name+"="+tt.value, func(t *testing.T) {
			t.Setenv(tt.name, tt.value)
			_, err := Load()
			if err == nil || err.Error() != "configuration: "+tt.want {
				t.Errorf("got  %v\nwant configuration: %s", err, tt.want)
			}
			if err != nil && (strings.Contains(err.Error(), "s3") || strings.Contains(err.Error(), "999")) {
				t.Errorf("error leaks the password: %v", err)
			}
		})
	}
}

func TestConfigDefaultsAreValid(t *testing.T) {
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if c.QueueCount != 8 || c.Prefix != "transfers" || c.AMQPURL != "amqp://guest:guest@localhost:5672/" ||
		c.DatabaseURL != "postgres://postgres@localhost:5432/transfers?sslmode=disable" {
		t.Errorf("defaults differ from the contract: %+v", c)
	}
}

// --help lists every variable, and those the runtime and OpenTelemetry
// read, as rows of one table, each column starting where its heading does.
func TestHelpListsEveryVariable(t *testing.T) {
	var out bytes.Buffer
	if err := PrintUsage(&out); err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(out.String(), "\nVARIABLE ")
	if !ok {
		t.Fatalf("--help has no table of variables:\n%s", out.String())
	}
	table = "VARIABLE " + table
	header, _, _ := strings.Cut(table, "\n")
	defaultCol, meaningCol := strings.Index(header, "DEFAULT"), strings.Index(header, "MEANING")
	rows := map[string]string{}
	for _, line := range strings.Split(table, "\n")[1:] {
		if line == "" {
			break
		}
		name, _, _ := strings.Cut(line, " ")
		rows[name] = line
	}

	var tests []struct{ name, meaning string }
	for _, v := range Standard() {
		tests = append(tests, struct{ name, meaning string }{v.Name, v.Meaning})
	}
	fields := reflect.TypeFor[Config]()
	for i := range fields.NumField() {
		f := fields.Field(i)
		tests = append(tests, struct{ name, meaning string }{f.Tag.Get("envconfig"), f.Tag.Get("desc")})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			row, ok := rows[tt.name]
			switch {
			case !ok:
				t.Fatalf("--help does not list %s", tt.name)
			case len(row) <= meaningCol || row[meaningCol-1] != ' ' || row[meaningCol] == ' ':
				t.Errorf("%s's meaning does not start under MEANING:\n%s\n%s", tt.name, header, row)
			case row[defaultCol-1] != ' ' || !strings.Contains(row[meaningCol:], tt.meaning):
				t.Errorf("%s's row is out of line or lacks %q:\n%s\n%s", tt.name, tt.meaning, header, row)
			}
		})
	}
	if want := len(tests); len(rows) != want {
		t.Errorf("the table has %d rows, want %d", len(rows), want)
	}
}

// A credential is hidden wherever it sits in a setting: a URL's userinfo
// (even a password that should have been percent-encoded), a password or
// sslpassword query parameter, lib/pq's key=value form.
func TestRedactHidesEveryCredential(t *testing.T) {
	tests := []struct{ setting, want string }{
		{"amqp://user:s3cret@host:5672/vh", "amqp://user:xxxxx@host:5672/vh"},
		{"amqp://u:s3cret@n1/,amqp://u:s3cret@n2/", "amqp://u:xxxxx@n1/,amqp://u:xxxxx@n2/"},
		{"amqp://u:s3,cret@n1/, amqp://u:s3cret@n2/", "amqp://u:xxxxx@n1/, amqp://u:xxxxx@n2/"},
		{"postgres://u@h/db?password=s3cret", "postgres://u@h/db?password=xxxxx"},
		{"postgres://u@h/db?sslmode=verify-full&sslpassword=s3cret&connect_timeout=5",
			"postgres://u@h/db?sslmode=verify-full&sslpassword=xxxxx&connect_timeout=5"},
		{"postgres://u@h/db?pass%77ord=s3cret", "postgres://u@h/db?pass%77ord=xxxxx"},
		{"postgres://u:s3cret@h/db?password=s3cret", "postgres://u:xxxxx@h/db?password=xxxxx"},
		{"postgres://u:s3/cret@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u:s3cr@t@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u:s3?cret@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u:12#s3cret@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u:12/s3cret@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u:s3 cret@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u:s3cret@h1:5432,h2:5433/db?target_session_attrs=read-write",
			"postgres://u:xxxxx@h1:5432,h2:5433/db?target_session_attrs=read-write"},
		{"postgres://u:s3/cret@h1:5432,h2:5433/db", "postgres://u:xxxxx@h1:5432,h2:5433/db"},
		{"postgres://u@[::1]:5432,[::2]:5433/db?password=s3cret", "postgres://u@[::1]:5432,[::2]:5433/db?password=xxxxx"},
		{"host=h1,h2 port=5432,5433 password=s3cret dbname=x", "host=h1,h2 port=5432,5433 password=xxxxx dbname=x"},
		{"host=h password=s3cret dbname=x", "host=h password=xxxxx dbname=x"},
		{"host=h password = s3cret", "host=h password = xxxxx"},
		{"host=h password='s3 cret' dbname=x", "host=h password=xxxxx dbname=x"},
		{`password='it\'s s3cret' host=h`, "password=xxxxx host=h"},
		{"host=h sslpassword=s3cret", "host=h sslpassword=xxxxx"},
		{"host=h password='s3 cret", "host=h password=xxxxx"},
		// Nothing to hide: the setting is printed as it is.
		{"postgres://postgres@localhost:5432/transfers?sslmode=disable", "postgres://postgres@localhost:5432/transfers?sslmode=disable"},
		{"amqp://guest@h/", "amqp://guest@h/"},
		{"amqp://h:5672/vh", "amqp://h:5672/vh"},
		{"postgres://u@h/db?password=", "postgres://u@h/db?password="},
	}
	for _, tt := range tests {
		t.Run(tt.setting, func(t *testing.T) {
			if got := Redact(tt.setting); got != tt.want {
				t.Errorf("redact = %s, want %s", got, tt.want)
			}
		})
	}
}

// Errors quote settings: a *url.Error the whole URL, %q-quoted, with any
// blank in it; a driver its key=value string.
func TestRedactTextHidesCredentialsInErrors(t *testing.T) {
	tests := []struct{ text, want string }{
		{`parse "postgres://u:s3cret@h:x/db": invalid port ":x" after host`,
			`parse "postgres://u:xxxxx@h:x/db": invalid port ":x" after host`},
		{`parse "postgres://u:s3 cret@h/db": invalid character " " in host name`,
			`parse "postgres://u:xxxxx@h/db": invalid character " " in host name`},
		{`parse "postgres://u:s3/cret@h/db": invalid port ":s3" after host`,
			`parse "postgres://u:xxxxx@h/db": invalid port ":s3" after host`},
		{`parse "postgres://u@h/db?password=s3cret": bad`, `parse "postgres://u@h/db?password=xxxxx": bad`},
		{"dial amqp://u:s3cret@n1:5672/: connection refused", "dial amqp://u:xxxxx@n1:5672/: connection refused"},
		{"amqp://u:s3cret@n1/,amqp://u:s3cret@n2/: no node answers", "amqp://u:xxxxx@n1/,amqp://u:xxxxx@n2/: no node answers"},
		{`cannot use "host=h password='s3 cret' dbname=x"`, `cannot use "host=h password=xxxxx dbname=x"`},
		{"conninfo host=h password=s3cret sslpassword=s3cret", "conninfo host=h password=xxxxx sslpassword=xxxxx"},
		{`pq: password authentication failed for user "u"`, `pq: password authentication failed for user "u"`},
	}
	for _, tt := range tests {
		t.Run(tt.text, func(t *testing.T) {
			if got := RedactText(tt.text); got != tt.want {
				t.Errorf("redactText = %s\nwant %s", got, tt.want)
			}
		})
	}
}

// AMQP_URL may list a cluster's nodes; each is an AMQP URL of its own.
func TestAMQPURLListsNodes(t *testing.T) {
	t.Setenv("AMQP_URL", "amqp://g:g@n1:5672/, amqp://g:g@n2:5672/,amqp://g:g@n3:5672/")
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Consumer(nil).URLs; len(got) != 3 || got[1] != "amqp://g:g@n2:5672/" {
		t.Errorf("URLs = %q, want the three nodes in order", got)
	}
}

// writeSecret writes content to a file of the test's own, as a mounted
// secret is: readable by its owner alone.
func writeSecret(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// AMQP_URL_FILE and DATABASE_URL_FILE hold what AMQP_URL and DATABASE_URL
// would, and are read again at each use: a rewritten file is what the next
// connection uses.
func TestConfigReadsURLsFromFilesAtEachUse(t *testing.T) {
	amqpFile := writeSecret(t, "amqp://svc:one@n1:5672/vh\namqp://svc:one@n2:5672/vh\n")
	dbFile := writeSecret(t, "postgres://svc:one@db:5432/transfers?sslmode=verify-full\n")
	t.Setenv("AMQP_URL_FILE", amqpFile)
	t.Setenv("DATABASE_URL_FILE", dbFile)
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	cc := c.Consumer(nil)
	if cc.URLsFunc == nil {
		t.Fatal("the consumer is given no URLsFunc: the file would be read once")
	}
	urls, err := cc.URLsFunc()
	if err != nil || len(urls) != 2 || urls[1] != "amqp://svc:one@n2:5672/vh" {
		t.Fatalf("URLsFunc = %q, %v, want the file's two nodes", urls, err)
	}
	if u, err := c.Database(); err != nil || u != "postgres://svc:one@db:5432/transfers?sslmode=verify-full" {
		t.Fatalf("databaseURL = %q, %v, want the file's URL without its newline", u, err)
	}

	// Rotated: the files are rewritten in place.
	if err := os.WriteFile(amqpFile, []byte("amqp://svc:two@n1:5672/vh"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dbFile, []byte("postgres://svc:two@db:5432/transfers"), 0o600); err != nil {
		t.Fatal(err)
	}
	if urls, err := cc.URLsFunc(); err != nil || len(urls) != 1 || urls[0] != "amqp://svc:two@n1:5672/vh" {
		t.Errorf("after the rotation URLsFunc = %q, %v, want the new URL", urls, err)
	}
	if u, err := c.Database(); err != nil || u != "postgres://svc:two@db:5432/transfers" {
		t.Errorf("after the rotation databaseURL = %q, %v, want the new URL", u, err)
	}

	// Without the files, the consumer has its URLs once and for all.
	t.Setenv("AMQP_URL_FILE", "")
	t.Setenv("DATABASE_URL_FILE", "")
	c, err = Load()
	if err != nil {
		t.Fatal(err)
	}
	if cc := c.Consumer(nil); cc.URLsFunc != nil || len(cc.URLs) != 1 {
		t.Errorf("without AMQP_URL_FILE: URLs %q, URLsFunc set %v", cc.URLs, cc.URLsFunc != nil)
	}
}

// A value and a file for the same setting are refused; an empty value
// counts as unset.
func TestConfigRefusesAValueAndItsFile(t *testing.T) {
	amqpFile := writeSecret(t, "amqp://svc:s3cret@n1/")
	dbFile := writeSecret(t, "postgres://svc:s3cret@db/transfers")
	tests := []struct {
		env  map[string]string
		want string // "" when accepted
	}{
		{map[string]string{"AMQP_URL": "amqp://g:g@h/", "AMQP_URL_FILE": amqpFile}, "configuration: AMQP_URL and AMQP_URL_FILE are both set: set one"},
		{map[string]string{"DATABASE_URL": "postgres://u@h/db", "DATABASE_URL_FILE": dbFile}, "configuration: DATABASE_URL and DATABASE_URL_FILE are both set: set one"},
		{map[string]string{"AMQP_URL": "", "AMQP_URL_FILE": amqpFile, "DATABASE_URL": "", "DATABASE_URL_FILE": dbFile}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			_, err := Load()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || err.Error() != tt.want):
				t.Errorf("got  %v\nwant %s", err, tt.want)
			}
		})
	}
}

// A file that cannot be used stops the service at start with an error
// that names the variable and the file, and quotes nothing of what the
// file holds: it may be a bare password, put there by mistake.
func TestConfigFileErrorsNameTheFileNeverItsContent(t *testing.T) {
	dir := t.TempDir()
	unreadable := filepath.Join(dir, "unreadable")
	if err := os.Mkdir(unreadable, 0o700); err != nil { // a directory: reading it fails, even as root
		t.Fatal(err)
	}
	tests := []struct {
		variable, content string // content "" with path set: the file is not written
		path              string
		want              string // after "configuration: VARIABLE_FILE"
	}{
		{"DATABASE_URL", "", filepath.Join(dir, "missing"), ": open " + filepath.Join(dir, "missing") + ": no such file or directory"},
		{"DATABASE_URL", "", unreadable, ": read " + unreadable + ": is a directory"},
		{"DATABASE_URL", " \n", "", " (PATH): empty"},
		{"DATABASE_URL", "s3cret\n", "", " (PATH): want postgres://user@host:port/database?sslmode=…, the file holds something else"},
		{"DATABASE_URL", "mysql://u:s3cret@h/db", "", " (PATH): want postgres://user@host:port/database?sslmode=…, the file holds something else"},
		{"DATABASE_URL", "postgres://u:s3/cret@h/db", "", " (PATH): not a URL (invalid port after host; a / ? # @ % , or blank in a password must be percent-encoded)"},
		{"DATABASE_URL", "postgres://u:s3cret@h:x/db", "", " (PATH): not a URL (invalid port after host; a / ? # @ % , or blank in a password must be percent-encoded)"},
		{"DATABASE_URL", strings.Repeat("s3cret", 20000), "", " (PATH): larger than 64 KiB: not a URL"},
		{"AMQP_URL", "s3cret", "", " (PATH): not an AMQP URL (AMQP scheme must be either 'amqp://' or 'amqps://')"},
		{"AMQP_URL", "amqp://u:s3cret@n1/\namqp://u:s3cret@n2:x/", "", " (PATH): URL 2: not a URL (invalid port after host; a / ? # @ % , or blank in a password must be percent-encoded)"},
		{"AMQP_URL", "amqp://u:99999999999,s3cret@n1/", "", " (PATH): URL 1: not an AMQP URL (strconv.ParseInt: parsing: value out of range; a / ? # @ % , or blank in a password must be percent-encoded)"},
	}
	for _, tt := range tests {
		t.Run(tt.variable+" "+tt.want, func(t *testing.T) {
			path := tt.path
			if path == "" {
				path = writeSecret(t, tt.content)
			}
			t.Setenv(tt.variable, "")
			t.Setenv(tt.variable+"_FILE", path)
			_, err := Load()
			want := "configuration: " + tt.variable + "_FILE" + strings.ReplaceAll(tt.want, "PATH", path)
			if err == nil || err.Error() != want {
				t.Errorf("got  %v\nwant %s", err, want)
			}
			// The file's path is random and may hold any digits; what
			// must not appear is the file's content.
			var rest string
			if err != nil {
				rest = strings.ReplaceAll(err.Error(), path, "PATH")
			}
			if strings.Contains(rest, "s3") || strings.Contains(rest, "999") {
				t.Errorf("error quotes the file's content: %v", err)
			}
		})
	}
}

// MIGRATE is on unless set to false; the quick start migrates.
func TestConfigMigrate(t *testing.T) {
	for _, tt := range []struct {
		value string
		want  bool
	}{{"", true}, {"true", true}, {"false", false}} {
		t.Run(tt.value, func(t *testing.T) {
			if tt.value != "" {
				t.Setenv("MIGRATE", tt.value)
			}
			c, err := Load()
			if err != nil || c.Migrate != tt.want {
				t.Errorf("MIGRATE=%q: %v, %v, want %v", tt.value, c.Migrate, err, tt.want)
			}
		})
	}
}

// MANAGEMENT_URL_FILE is read at load, to check it, and again at each
// check of the topology: a rotated password is used without a restart. A
// file holding something else is named, never quoted.
func TestManagementURLFromAFile(t *testing.T) {
	path := writeSecret(t, "http://mon:pw-one@h:15672\n")
	t.Setenv("MANAGEMENT_URL_FILE", path)
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.management()
	if err != nil || m == nil || m.URLFunc == nil {
		t.Fatalf("management() = %+v, %v; want one that reads the file again", m, err)
	}
	if err := os.WriteFile(path, []byte("http://mon:pw-two@h:15672\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	u, err := m.URLFunc()
	if p, _ := u.User.Password(); err != nil || p != "pw-two" {
		t.Errorf("after the rewrite: %v, %v; want the new password", u, err)
	}

	if err := os.WriteFile(path, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load()
	want := "configuration: MANAGEMENT_URL_FILE (" + path + "): want http[s]://[user:password@]host:port, the file holds something else"
	if err == nil || err.Error() != want {
		t.Errorf("got  %v\nwant %s", err, want)
	}

	t.Setenv("MANAGEMENT_URL", "http://h:15672")
	if _, err := Load(); err == nil || !strings.Contains(err.Error(), "MANAGEMENT_URL and MANAGEMENT_URL_FILE are both set") {
		t.Errorf("both set: %v", err)
	}
}

// The start-up line names every host of a multi-host database URL, in
// either of libpq's forms, and never a password.
func TestSummaryNamesTheHostsAndHidesThePasswords(t *testing.T) {
	for _, dsn := range []string{
		"postgres://svc:s3cret@db1:5432,db2:5433/transfers?sslmode=disable&target_session_attrs=read-write",
		"host=db1,db2 port=5432,5433 user=svc password=s3cret dbname=transfers sslmode=disable target_session_attrs=read-write",
	} {
		t.Setenv("DATABASE_URL", dsn)
		t.Setenv("AMQP_URL", "amqp://svc:s3cret@broker:5672/")
		cfg, err := Load()
		if err != nil {
			t.Fatal(err)
		}
		attrs := map[string]any{}
		summary := cfg.Summary()
		for i := 0; i+1 < len(summary); i += 2 {
			attrs[summary[i].(string)] = summary[i+1]
		}
		if got := attrs["database_hosts"]; got != "db1:5432,db2:5433" {
			t.Errorf("%s: database_hosts %v, want db1:5432,db2:5433", dsn, got)
		}
		if line := fmt.Sprint(summary...); strings.Contains(line, "s3cret") {
			t.Errorf("the start-up line shows a password: %s", line)
		}
	}
}
