package main

import (
	"bytes"
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
		{map[string]string{"DATABASE_URL": "host=h password=s3cret dbname=x"}, "DATABASE_URL"},
		{map[string]string{"DATABASE_URL": "mysql://u@h/db?password=s3cret"}, "DATABASE_URL"},
		{map[string]string{"DELIVERY_LIMIT": "0"}, "DELIVERY_LIMIT"},
		{map[string]string{"SHUTDOWN_TIMEOUT": "soon"}, "SHUTDOWN_TIMEOUT"},
		{map[string]string{"RETRY_MIN": "5s", "RETRY_MAX": "1s"}, "RETRY_MIN/RETRY_MAX"},
		{map[string]string{"TOPOLOGY_PREFIX": ""}, "TOPOLOGY_PREFIX"},
		{map[string]string{"LOG_LEVEL": "loud"}, "LOG_LEVEL"},
		{map[string]string{"LOG_FORMAT": "xml"}, "LOG_FORMAT"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			_, err := loadConfig()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v does not name %s", err, tt.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error leaks the password: %v", err)
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
			_, err := loadConfig()
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
		{"DATABASE_URL", "host=h password='s3 cret' dbname=x",
			`DATABASE_URL: want postgres://user@host:port/database?sslmode=…, got "host=h password=xxxxx dbname=x"`},
		{"AMQP_URL", "amqp://u:s3cret@[::1", `AMQP_URL: not a URL (missing ']' in host)`},
		{"AMQP_URL", "amqp://u:s3/cret@h/", `AMQP_URL: not a URL (invalid port after host` + encode + `)`},
		{"AMQP_URL", "amqp://u:s3cret@n1/, amqp://u:s3cret@n2:x/", `AMQP_URL: URL 2: not a URL (invalid port ":x" after host)`},
		{"AMQP_URL", "amqp://u:s3cret@n1/, http://n2/",
			`AMQP_URL: URL 2: not an AMQP URL (AMQP scheme must be either 'amqp://' or 'amqps://')`},
		// A comma in a password splits the list inside the userinfo.
		{"AMQP_URL", "amqp://u:s3,cret@n1/", `AMQP_URL: URL 1: not a URL (invalid port after host` + encode + `)`},
		{"AMQP_URL", "amqp://u:99999999999,s3cret@n1/",
			`AMQP_URL: URL 1: not an AMQP URL (strconv.ParseInt: parsing: value out of range` + encode + `)`},
	}
	for _, tt := range tests {
		t.Run(tt.name+"="+tt.value, func(t *testing.T) {
			t.Setenv(tt.name, tt.value)
			_, err := loadConfig()
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
	c, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if c.QueueCount != 8 || c.Prefix != "transfers" || c.AMQPURL != "amqp://guest:guest@localhost:5672/" ||
		c.DatabaseURL != "postgres://postgres@localhost:5432/transfers?sslmode=disable" {
		t.Errorf("defaults differ from the contract: %+v", c)
	}
}

// --help lists every variable, and GOGC, which the runtime reads, as rows of
// one table, each column starting where its heading does.
func TestHelpListsEveryVariable(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), []string{"--help"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"migrate", "topology", "prune", "repartition", "dlq list", "dlq replay"} {
		if !strings.Contains(out.String(), "  "+cmd) {
			t.Errorf("--help does not mention the command %s", cmd)
		}
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

	tests := []struct{ name, meaning string }{
		{"GOGC", "garbage-collection target"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTLP/HTTP endpoint"},
		{"OTEL_TRACES_EXPORTER", "otlp to trace"},
		{"OTEL_SERVICE_NAME", "service.name"},
	}
	fields := reflect.TypeFor[config]()
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
			if got := redact(tt.setting); got != tt.want {
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
			if got := redactText(tt.text); got != tt.want {
				t.Errorf("redactText = %s\nwant %s", got, tt.want)
			}
		})
	}
}

// AMQP_URL may list a cluster's nodes; each is an AMQP URL of its own.
func TestAMQPURLListsNodes(t *testing.T) {
	t.Setenv("AMQP_URL", "amqp://g:g@n1:5672/, amqp://g:g@n2:5672/,amqp://g:g@n3:5672/")
	c, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if got := c.consumerConfig(nil).URLs; len(got) != 3 || got[1] != "amqp://g:g@n2:5672/" {
		t.Errorf("URLs = %q, want the three nodes in order", got)
	}
}

func TestUnknownCommandFails(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), []string{"frobnicate"}, &out, &out); err == nil || !strings.Contains(err.Error(), "frobnicate") {
		t.Errorf("got %v", err)
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
			c, err := loadConfig()
			if err != nil || c.Migrate != tt.want {
				t.Errorf("MIGRATE=%q: %v, %v, want %v", tt.value, c.Migrate, err, tt.want)
			}
		})
	}
}
