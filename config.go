package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kelseyhightower/envconfig"
	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/consumer"
	"transferconsumer/db"
)

// config is every setting, each an environment variable; --help prints them.
type config struct {
	AMQPURL         string        `envconfig:"AMQP_URL" default:"amqp://guest:guest@localhost:5672/" desc:"RabbitMQ URL, vhost included; for a cluster, one URL per node, comma-separated, tried in turn (on loss the service moves to the next)"`
	AMQPURLFile     string        `envconfig:"AMQP_URL_FILE" desc:"file holding AMQP_URL's value (e.g. a mounted secret), read again at each connect, so a rotated password needs no restart; not with AMQP_URL"`
	DatabaseURL     string        `envconfig:"DATABASE_URL" default:"postgres://postgres@localhost:5432/transfers?sslmode=disable" desc:"PostgreSQL URL, or libpq's key=value form; several hosts (postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write) are tried in turn; the database is created if missing (when the user may and MIGRATE=true)"`
	DatabaseURLFile string        `envconfig:"DATABASE_URL_FILE" desc:"file holding DATABASE_URL's value, read again for each new connection, so a rotated password needs no restart; not with DATABASE_URL"`
	RequireSync     bool          `envconfig:"REQUIRE_SYNC_STANDBY" default:"false" desc:"refuse to consume while the database names no synchronous standby (synchronous_standby_names), as a failover to an asynchronous standby may lose events already acked; read at each new connection and every 10 s, and /readyz says why"`
	Migrate         bool          `envconfig:"MIGRATE" default:"true" desc:"apply missing migrations at start, when the role may; false never changes the database: the service only checks that the schema is current, and waits until it is"`
	QueueCount      int           `envconfig:"QUEUE_COUNT" default:"8" desc:"partition queues PREFIX.0 … PREFIX.(N-1) bound to the hash exchange"`
	Prefix          string        `envconfig:"TOPOLOGY_PREFIX" default:"transfers" desc:"name of the hash exchange and prefix of the queues, PREFIX.dlx and PREFIX.dlq"`
	DeliveryLimit   int           `envconfig:"DELIVERY_LIMIT" default:"10" desc:"quorum x-delivery-limit: returns of a message before the broker dead-letters it (so at most N+1 deliveries)"`
	DeclareTopology bool          `envconfig:"DECLARE_TOPOLOGY" default:"true" desc:"declare exchanges, queues and bindings on every connect"`
	ManagementURL   string        `envconfig:"MANAGEMENT_URL" desc:"RabbitMQ management API (http[s]://[user:password@]host:port), read with DECLARE_TOPOLOGY=false to check the arguments of the topology made by others, and every 10 s for the DLQ's depth and queues beyond QUEUE_COUNT; without credentials, AMQP_URL's are used; the user needs the management tag"`
	MgmtURLFile     string        `envconfig:"MANAGEMENT_URL_FILE" desc:"file holding MANAGEMENT_URL's value, read again at each check; not with MANAGEMENT_URL"`
	InstanceName    string        `envconfig:"INSTANCE_NAME" desc:"name in connection names, consumer tags and dead-letter headers (default HOSTNAME-PID)"`
	ReplicaIndex    int           `envconfig:"REPLICA_INDEX" default:"0" desc:"this replica's number, 0..REPLICA_COUNT-1: it prefers queues i with i % REPLICA_COUNT == REPLICA_INDEX (honoured by RabbitMQ 4.x, adr/0004)"`
	ReplicaCount    int           `envconfig:"REPLICA_COUNT" default:"1" desc:"how many replicas share the queues; 1 sets no consumer priorities"`
	ShutdownTimeout time.Duration `envconfig:"SHUTDOWN_TIMEOUT" default:"30s" desc:"time the message in hand may take to finish once SIGTERM arrives"`
	ApplyTimeout    time.Duration `envconfig:"APPLY_TIMEOUT" default:"15s" desc:"time one attempt to apply an event may take"`
	RetryMin        time.Duration `envconfig:"RETRY_MIN" default:"100ms" desc:"first wait before retrying a transient database failure"`
	RetryMax        time.Duration `envconfig:"RETRY_MAX" default:"10s" desc:"longest wait between retries of a transient database failure"`
	ReconnectMin    time.Duration `envconfig:"RECONNECT_MIN" default:"500ms" desc:"first wait before reconnecting to the broker or database"`
	ReconnectMax    time.Duration `envconfig:"RECONNECT_MAX" default:"30s" desc:"longest wait between reconnects"`
	DBMaxConns      int           `envconfig:"DB_MAX_CONNS" default:"0" desc:"database connection pool size (0: QUEUE_COUNT+4)"`
	BatchMax        int           `envconfig:"BATCH_MAX" default:"1" desc:"most events a queue's worker applies in one transaction (and the queue's prefetch); 1 is one event per transaction; raise it (e.g. 50) to drain backlogs faster (adr/0006)"`
	BatchLinger     time.Duration `envconfig:"BATCH_LINGER" default:"0s" desc:"how long a worker may wait for more events to fill a batch; 0 takes what has arrived, so a light load keeps its latency"`
	MaxBodyBytes    int           `envconfig:"MAX_BODY_BYTES" default:"65536" desc:"largest message body decoded; a larger one is dead-lettered as poison, undecoded"`
	HTTPAddr        string        `envconfig:"HTTP_ADDR" default:":8080" desc:"address of /healthz, /readyz and /metrics; empty to serve none"`
	Pprof           bool          `envconfig:"PPROF" default:"false" desc:"serve Go's /debug/pprof on PPROF_ADDR, for profiling"`
	PprofAddr       string        `envconfig:"PPROF_ADDR" default:"127.0.0.1:6060" desc:"address of /debug/pprof when PPROF=true; loopback by default: profiles are not for whoever reaches HTTP_ADDR"`
	InboxTTL        time.Duration `envconfig:"INBOX_TTL" default:"720h" desc:"how long an applied eventId is remembered (adr/0003); older rows are pruned"`
	PruneInterval   time.Duration `envconfig:"PRUNE_INTERVAL" default:"1m" desc:"how often retention runs (one replica at a time)"`
	PruneBatch      int           `envconfig:"PRUNE_BATCH" default:"5000" desc:"inbox rows deleted per statement"`
	ReconcileEvery  time.Duration `envconfig:"RECONCILE_INTERVAL" default:"1h" desc:"how often the service reconciles balances with transfers and looks for duplicate intents and stuck transitions (one replica at a time, adr/0007); 0 never"`
	ReconcileWindow time.Duration `envconfig:"RECONCILE_WINDOW" default:"1h" desc:"two creations of one intent (same accounts, amount, currency) under different transferIds at most this far apart are a suspected duplicate"`
	PendingAfter    time.Duration `envconfig:"RECONCILE_PENDING_AFTER" default:"1h" desc:"a transition waiting for its creation longer than this is reported"`
	ReconcileDLQ    bool          `envconfig:"RECONCILE_DLQ" default:"false" desc:"the periodic reconciliation also counts dead letters older than INBOX_TTL (needs read on PREFIX.dlq, as dlq list)"`
	LogLevel        string        `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
	LogFormat       string        `envconfig:"LOG_FORMAT" default:"json" desc:"json or text"`
}

func loadConfig() (config, error) {
	var c config
	if err := envconfig.Process("", &c); err != nil {
		if pe, ok := errors.AsType[*envconfig.ParseError](err); ok {
			return c, fmt.Errorf("configuration: %s: %s", pe.KeyName, notConverted(pe))
		}
		return c, fmt.Errorf("configuration: %w", err)
	}
	// A value and a file for it: neither is obviously the one meant. Empty
	// counts as unset, as in the official images' entrypoints.
	for _, name := range []string{"AMQP_URL", "DATABASE_URL", "MANAGEMENT_URL"} {
		if os.Getenv(name) != "" && os.Getenv(name+"_FILE") != "" {
			return c, fmt.Errorf("configuration: %s and %[1]s_FILE are both set: set one", name)
		}
	}
	return c, c.validate()
}

// notConverted says, by the type of its field, what form a value envconfig
// could not convert should have: its own message names the Go field and
// quotes strconv's details.
func notConverted(pe *envconfig.ParseError) string {
	var want string
	switch pe.TypeName {
	case "time.Duration":
		want = "a duration (like 30s or 2m)"
	case "bool":
		want = "true or false"
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		if errors.Is(pe.Err, strconv.ErrRange) {
			return fmt.Sprintf("%q is out of range", pe.Value)
		}
		want = "a whole number"
		if strings.HasPrefix(pe.TypeName, "uint") {
			want = "a whole number, 0 or more"
		}
	case "float32", "float64":
		want = "a number"
	default:
		return fmt.Sprintf("%q is not a valid %s: %v", pe.Value, pe.TypeName, pe.Err)
	}
	return fmt.Sprintf("%q is not %s", pe.Value, want)
}

// validate rejects values the service cannot run with, naming the variable.
func (c config) validate() error {
	bad := func(name, format string, a ...any) error {
		return fmt.Errorf("configuration: %s: %s", name, fmt.Sprintf(format, a...))
	}
	if _, err := c.brokerURLs(); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if _, err := c.databaseURL(); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if _, err := c.management(); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if err := c.checkTLSFiles(); err != nil { // tlsfiles.go
		return fmt.Errorf("configuration: %w", err)
	}
	switch {
	case c.QueueCount < 1 || c.QueueCount > 1024:
		return bad("QUEUE_COUNT", "must be between 1 and 1024, got %d", c.QueueCount)
	case c.Prefix == "" || strings.ContainsAny(c.Prefix, " \t\n"):
		return bad("TOPOLOGY_PREFIX", "must be a non-empty name without spaces, got %q", c.Prefix)
	case c.DeliveryLimit < 1:
		return bad("DELIVERY_LIMIT", "must be at least 1, got %d", c.DeliveryLimit)
	case c.ReplicaCount < 1 || c.ReplicaIndex < 0 || c.ReplicaIndex >= c.ReplicaCount:
		return bad("REPLICA_INDEX/REPLICA_COUNT", "need 0 <= REPLICA_INDEX < REPLICA_COUNT, got %d and %d", c.ReplicaIndex, c.ReplicaCount)
	case c.ShutdownTimeout <= 0:
		return bad("SHUTDOWN_TIMEOUT", "must be positive, got %s", c.ShutdownTimeout)
	case c.ApplyTimeout <= 0:
		return bad("APPLY_TIMEOUT", "must be positive, got %s", c.ApplyTimeout)
	case c.RetryMin <= 0 || c.RetryMax < c.RetryMin:
		return bad("RETRY_MIN/RETRY_MAX", "need 0 < RETRY_MIN <= RETRY_MAX, got %s and %s", c.RetryMin, c.RetryMax)
	case c.ReconnectMin <= 0 || c.ReconnectMax < c.ReconnectMin:
		return bad("RECONNECT_MIN/RECONNECT_MAX", "need 0 < RECONNECT_MIN <= RECONNECT_MAX, got %s and %s", c.ReconnectMin, c.ReconnectMax)
	case c.InboxTTL < time.Hour:
		return bad("INBOX_TTL", "must be at least 1h (see adr/0003), got %s", c.InboxTTL)
	case c.PruneInterval <= 0:
		return bad("PRUNE_INTERVAL", "must be positive, got %s", c.PruneInterval)
	case c.PruneBatch < 1 || c.PruneBatch > 100000:
		return bad("PRUNE_BATCH", "must be between 1 and 100000, got %d", c.PruneBatch)
	case c.ReconcileEvery < 0:
		return bad("RECONCILE_INTERVAL", "must not be negative (0 turns it off), got %s", c.ReconcileEvery)
	case c.ReconcileWindow <= 0:
		return bad("RECONCILE_WINDOW", "must be positive, got %s", c.ReconcileWindow)
	case c.PendingAfter <= 0:
		return bad("RECONCILE_PENDING_AFTER", "must be positive, got %s", c.PendingAfter)
	case c.DBMaxConns < 0:
		return bad("DB_MAX_CONNS", "must not be negative, got %d", c.DBMaxConns)
	case c.BatchMax < 1 || c.BatchMax > maxBatch:
		return bad("BATCH_MAX", "must be between 1 and %d, got %d", maxBatch, c.BatchMax)
	case c.MaxBodyBytes < 1024 || c.MaxBodyBytes > 128<<20:
		return bad("MAX_BODY_BYTES", "must be between 1024 and %d, got %d", 128<<20, c.MaxBodyBytes)
	case c.BatchLinger < 0 || c.BatchLinger > time.Second:
		return bad("BATCH_LINGER", "must be between 0 and 1s, got %s", c.BatchLinger)
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		return bad("LOG_LEVEL", "must be debug, info, warn or error, got %q", c.LogLevel)
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		return bad("LOG_FORMAT", "must be json or text, got %q", c.LogFormat)
	}
	return nil
}

// urlProblem says why setting, or one URL of its list, does not parse,
// without quoting it: a *url.Error's text holds the whole URL, password
// included, so the reason is its inner error, stripped of any fragment
// that belongs to a credential.
func urlProblem(err error, setting string) string {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		err = ue.Err
	}
	reason, dropped := reasonWithoutCredentials(err.Error(), setting)
	if dropped || strings.Contains(reason, "userinfo") {
		reason += "; a / ? # @ % , or blank in a password must be percent-encoded"
	}
	return reason
}

// brokerURLs returns the broker's URLs, one or one per node of a cluster:
// AMQP_URL's, or those in AMQP_URL_FILE, read now. Each must be an AMQP
// URL. An error names the variable (and the file) and never quotes a
// password.
func (c config) brokerURLs() ([]string, error) {
	setting, name, err := fromFile("AMQP_URL", c.AMQPURL, c.AMQPURLFile)
	if err != nil {
		return nil, err
	}
	urls := splitURLs(setting)
	for i, u := range urls {
		where := name
		if len(urls) > 1 {
			where = fmt.Sprintf("%s: URL %d", name, i+1)
		}
		if _, err := url.Parse(u); err != nil {
			return nil, fmt.Errorf("%s: not a URL (%s)", where, urlProblem(err, quotable(setting, c.AMQPURLFile)))
		}
		if _, err := amqp.ParseURI(u); err != nil {
			return nil, fmt.Errorf("%s: not an AMQP URL (%s)", where, urlProblem(err, quotable(setting, c.AMQPURLFile)))
		}
	}
	return urls, nil
}

// quotable returns what of setting an error may quote, redacted: all of
// it when it is a variable's value, nothing when it was read from a file.
// A file may hold anything, a bare password by mistake too, and nothing
// there is known to be safe to print.
func quotable(setting, file string) string {
	if file != "" {
		return ""
	}
	return setting
}

// databaseURL returns DATABASE_URL, or what DATABASE_URL_FILE holds, read
// now, once it is checked to be a PostgreSQL URL. An error names the
// variable (and the file) and never quotes a password. It is the
// database pool's db.Source: asked again for each new connection.
func (c config) databaseURL() (string, error) {
	setting, name, err := fromFile("DATABASE_URL", c.DatabaseURL, c.DatabaseURLFile)
	if err != nil {
		return "", err
	}
	// Either of libpq's forms, one host or several (db.ParseDSN).
	dsn, err := db.ParseDSN(setting)
	switch {
	case errors.Is(err, db.ErrNotPostgres), err == nil && dsn.IsURI() && len(dsn.Hosts()) == 0:
		got := "the file holds something else"
		if c.DatabaseURLFile == "" {
			got = fmt.Sprintf("got %q", redact(setting))
		}
		return "", fmt.Errorf("%s: want postgres://user@host:port/database?sslmode=…, %s", name, got)
	case err != nil && (strings.Contains(setting, "://") || !strings.Contains(setting, "=")):
		return "", fmt.Errorf("%s: not a URL (%s)", name, urlProblem(err, quotable(setting, c.DatabaseURLFile)))
	case err != nil:
		return "", fmt.Errorf("%s: not a connection string (%v)", name, err) // ParseDSN's quote no value
	}
	return setting, nil
}

// maxSecretFile bounds what is read of a *_FILE: a URL, not a disk image.
const maxSecretFile = 64 << 10

// fromFile returns a setting's value, and how to name it in an error: the
// variable's own value when file is "", else the file's content, read now,
// without the blanks and newline around it (a secret written by echo, or
// by an editor, ends with one). A file that cannot be read, is empty, or is
// larger than a URL has any reason to be is an error that names it.
func fromFile(variable, value, file string) (string, string, error) {
	if file == "" {
		return value, variable, nil
	}
	name := fmt.Sprintf("%s_FILE (%s)", variable, file)
	f, err := os.Open(file)
	if err != nil {
		return "", name, fmt.Errorf("%s_FILE: %w", variable, err) // *PathError names the file
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	switch {
	case err != nil:
		return "", name, fmt.Errorf("%s_FILE: %w", variable, err)
	case len(b) > maxSecretFile:
		return "", name, fmt.Errorf("%s: larger than %d KiB: not a URL", name, maxSecretFile>>10)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", name, fmt.Errorf("%s: empty", name)
	}
	return v, name, nil
}

// splitURLs splits a list of URLs at commas, and at line ends (a file may
// hold one URL per line).
func splitURLs(setting string) []string {
	var urls []string
	for _, u := range strings.FieldsFunc(setting, func(r rune) bool { return r == ',' || r == '\n' || r == '\r' }) {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	if len(urls) == 0 {
		return []string{""} // ParseURI says what is wrong with it
	}
	return urls
}

func (c config) instance() string {
	if c.InstanceName != "" {
		return c.InstanceName
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// maxBatch bounds BATCH_MAX: a batch's transaction holds the locks of all
// its events until the commit, and its events wait for each other; beyond
// a few hundred nothing more is amortised (adr/0006).
const maxBatch = 500

// pprofAddr is where /debug/pprof is served: nowhere unless PPROF=true.
func (c config) pprofAddr() string {
	if !c.Pprof {
		return ""
	}
	return c.PprofAddr
}

func (c config) dbMaxConns() int {
	if c.DBMaxConns > 0 {
		return c.DBMaxConns
	}
	// One per consuming queue, plus the prune job, the readiness ping and the
	// oldest-row gauge, so that none of them makes a consumer wait.
	return c.QueueCount + 4
}

func (c config) backoff() consumer.Backoff {
	return consumer.Backoff{Min: c.ReconnectMin, Max: c.ReconnectMax}
}

func (c config) topology() consumer.Topology {
	return consumer.Topology{Prefix: c.Prefix, Queues: c.QueueCount, DeliveryLimit: c.DeliveryLimit}
}

// management returns the management API MANAGEMENT_URL names, nil when
// it is unset. An error names the variable and never quotes a password.
func (c config) management() (*consumer.Management, error) {
	if c.ManagementURL == "" && c.MgmtURLFile == "" {
		return nil, nil
	}
	u, err := c.managementURL()
	if err != nil {
		return nil, err
	}
	m := &consumer.Management{URL: u}
	if c.MgmtURLFile != "" {
		m.URLFunc = c.managementURL
	}
	return m, nil
}

// managementURL returns MANAGEMENT_URL, or what MANAGEMENT_URL_FILE holds,
// read now, once it is checked to be an http or https URL.
func (c config) managementURL() (*url.URL, error) {
	setting, name, err := fromFile("MANAGEMENT_URL", c.ManagementURL, c.MgmtURLFile)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(setting)
	if err != nil {
		return nil, fmt.Errorf("%s: not a URL (%s)", name, urlProblem(err, quotable(setting, c.MgmtURLFile)))
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		got := "the file holds something else"
		if c.MgmtURLFile == "" {
			got = fmt.Sprintf("got %q", redact(setting))
		}
		return nil, fmt.Errorf("%s: want http[s]://[user:password@]host:port, %s", name, got)
	}
	return u, nil
}

func (c config) consumerConfig(log *slog.Logger) consumer.Config {
	urls, _ := c.brokerURLs() // validated at load; a file is read again at each dial
	mgmt, _ := c.management() // validated at load
	var urlsFunc func() ([]string, error)
	if c.AMQPURLFile != "" {
		urlsFunc = c.brokerURLs
	}
	return consumer.Config{
		URLs:            urls,
		URLsFunc:        urlsFunc,
		Topology:        c.topology(),
		Declare:         c.DeclareTopology,
		Management:      mgmt,
		Instance:        c.instance(),
		ReplicaIndex:    c.ReplicaIndex,
		ReplicaCount:    c.ReplicaCount,
		ShutdownTimeout: c.ShutdownTimeout,
		ApplyTimeout:    c.ApplyTimeout,
		BatchMax:        c.BatchMax,
		BatchLinger:     c.BatchLinger,
		MaxBodyBytes:    c.MaxBodyBytes,
		Retry:           consumer.Backoff{Min: c.RetryMin, Max: c.RetryMax},
		Reconnect:       c.backoff(),
		Logger:          log,
	}
}

func printUsage(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	const format = "Environment variables:\n\n" +
		"VARIABLE\tDEFAULT\tMEANING\n" +
		"{{range .}}{{usage_key .}}\t{{usage_default .}}\t{{usage_description .}}\n{{end}}"
	if err := envconfig.Usagef("", &config{}, tw, format); err != nil {
		return err
	}
	// GOGC is the Go runtime's, not a field: main sets defaultGCPercent only
	// when it is unset.
	fmt.Fprintf(tw, "GOGC\t%d when unset\tGo's garbage-collection target, in percent of the live heap; the service's heap is small, "+
		"so %[1]d trades about 12 MiB of memory for a quarter of the collections (BENCHMARKS.md)\n", defaultGCPercent)
	// OpenTelemetry's standard variables, read by tracing.go and its
	// exporter: traces go out only when one of the first two is set.
	for _, v := range [][3]string{
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "", "OTLP/HTTP endpoint (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); when set, each delivery and transaction is traced"},
		{"OTEL_TRACES_EXPORTER", "", "otlp to trace (with the exporter's defaults), none to never trace"},
		{"OTEL_SERVICE_NAME", "transferconsumer", "service.name of the spans"},
	} {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", v[0], v[1], v[2])
	}
	fmt.Fprintln(tw)
	return tw.Flush()
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}

// newLogger returns the service's logger, writing to w through a logSink:
// info and debug lines at most 100 ms late, warnings and errors at once.
// The returned function writes what is held; call it before exiting.
func newLogger(c config, w io.Writer) (*slog.Logger, func() error, error) {
	level, err := parseLevel(c.LogLevel)
	if err != nil {
		return nil, nil, err
	}
	sink := newLogSink(w, 100*time.Millisecond, 64<<10)
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = plainJSON{slog.NewJSONHandler(sink, opts), level, sink}
	if c.LogFormat == "text" {
		h = slog.NewTextHandler(sink, opts)
	}
	return slog.New(flushAbove{h, slog.LevelWarn, sink}), sink.Close, nil
}
