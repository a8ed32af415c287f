// Package config is the service's configuration: every setting an
// environment variable (Config, read and checked by Load), the URLs read
// from files at each use, the TLS files those URLs name, checked at start,
// and the redaction of every credential wherever a setting is printed.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"

	"transferconsumer/consumer"
)

// Config is every setting, each an environment variable; --help prints them.
type Config struct {
	AMQPURL          string        `envconfig:"AMQP_URL" default:"amqp://guest:guest@localhost:5672/" desc:"RabbitMQ URL, vhost included; for a cluster, one URL per node, comma-separated, tried in turn (on loss the service moves to the next)"`
	AMQPURLFile      string        `envconfig:"AMQP_URL_FILE" desc:"file holding AMQP_URL's value (e.g. a mounted secret), read again at each connect, so a rotated password needs no restart; not with AMQP_URL"`
	DatabaseURL      string        `envconfig:"DATABASE_URL" default:"postgres://postgres@localhost:5432/transfers?sslmode=disable" desc:"PostgreSQL URL, or libpq's key=value form; several hosts (postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write) are tried in turn; the database is created if missing (when the user may and MIGRATE=true)"`
	DatabaseURLFile  string        `envconfig:"DATABASE_URL_FILE" desc:"file holding DATABASE_URL's value, read again for each new connection, so a rotated password needs no restart; not with DATABASE_URL"`
	RequireSync      bool          `envconfig:"REQUIRE_SYNC_STANDBY" default:"false" desc:"refuse to consume while the database names no synchronous standby (synchronous_standby_names), as a failover to an asynchronous standby may lose events already acked; read at each new connection and every 10 s, and /readyz says why"`
	Producers        string        `envconfig:"PRODUCERS" desc:"comma-separated broker users whose events are applied (their user_id); any other event, or one without user_id, is dead-lettered as unauthorized; empty accepts any publisher (adr/0008)"`
	Replayers        string        `envconfig:"REPLAYERS" desc:"comma-separated broker users that run dlq replay: a message whose user_id is one of them is judged by the first producer its x-original-user-id names; none may be in PRODUCERS too"`
	DLQAudit         string        `envconfig:"DLQ_AUDIT_LOG" desc:"file dlq replay and dlq drop append one JSON line per run to (who, when, the filter, how many replayed, confirmed, dropped, skipped and left, and which events went), synced; --audit overrides it; unset, a run records nothing and says so"`
	Migrate          bool          `envconfig:"MIGRATE" default:"true" desc:"apply missing migrations at start, when the role may; false never changes the database: the service only checks that the schema is current, and waits until it is"`
	QueueCount       int           `envconfig:"QUEUE_COUNT" default:"8" desc:"partition queues PREFIX.0 … PREFIX.(N-1) bound to the hash exchange"`
	Prefix           string        `envconfig:"TOPOLOGY_PREFIX" default:"transfers" desc:"name of the hash exchange and prefix of the queues, PREFIX.dlx and PREFIX.dlq"`
	DeliveryLimit    int           `envconfig:"DELIVERY_LIMIT" default:"10" desc:"quorum x-delivery-limit: returns of a message before the broker dead-letters it (so at most N+1 deliveries)"`
	DeclareTopology  bool          `envconfig:"DECLARE_TOPOLOGY" default:"true" desc:"declare exchanges, queues and bindings on every connect"`
	ManagementURL    string        `envconfig:"MANAGEMENT_URL" desc:"RabbitMQ management API (http[s]://[user:password@]host:port), read with DECLARE_TOPOLOGY=false to check the arguments of the topology made by others, and every 10 s for the DLQ's depth and queues beyond QUEUE_COUNT; without credentials, AMQP_URL's are used; the user needs the management tag"`
	MgmtURLFile      string        `envconfig:"MANAGEMENT_URL_FILE" desc:"file holding MANAGEMENT_URL's value, read again at each check; not with MANAGEMENT_URL"`
	InstanceName     string        `envconfig:"INSTANCE_NAME" desc:"name in connection names, consumer tags and dead-letter headers (default HOSTNAME-PID)"`
	ReplicaIndex     int           `envconfig:"REPLICA_INDEX" default:"0" desc:"this replica's number, 0..REPLICA_COUNT-1: it prefers queues i with i % REPLICA_COUNT == REPLICA_INDEX (honoured by RabbitMQ 4.x, adr/0004)"`
	ReplicaCount     int           `envconfig:"REPLICA_COUNT" default:"1" desc:"how many replicas share the queues; 1 sets no consumer priorities"`
	ShutdownTimeout  time.Duration `envconfig:"SHUTDOWN_TIMEOUT" default:"30s" desc:"time the message in hand may take to finish once SIGTERM arrives"`
	ApplyTimeout     time.Duration `envconfig:"APPLY_TIMEOUT" default:"15s" desc:"time one attempt to apply an event may take"`
	RetryMin         time.Duration `envconfig:"RETRY_MIN" default:"100ms" desc:"first wait before retrying a transient database failure"`
	RetryMax         time.Duration `envconfig:"RETRY_MAX" default:"10s" desc:"longest wait between retries of a transient database failure"`
	ReconnectMin     time.Duration `envconfig:"RECONNECT_MIN" default:"500ms" desc:"first wait before reconnecting to the broker or database"`
	ReconnectMax     time.Duration `envconfig:"RECONNECT_MAX" default:"30s" desc:"longest wait between reconnects"`
	DBMaxConns       int           `envconfig:"DB_MAX_CONNS" default:"0" desc:"database connection pool size (0: QUEUE_COUNT+4)"`
	BatchMax         int           `envconfig:"BATCH_MAX" default:"1" desc:"most events a queue's worker applies in one transaction (and the queue's prefetch, twice this with JOURNAL_STREAM); 1 is one event per transaction; raise it (e.g. 50) to drain backlogs faster (adr/0006)"`
	BatchLinger      time.Duration `envconfig:"BATCH_LINGER" default:"0s" desc:"how long a worker may wait for more events to fill a batch; 0 takes what has arrived, so a light load keeps its latency"`
	MaxBodyBytes     int           `envconfig:"MAX_BODY_BYTES" default:"65536" desc:"largest message body decoded; a larger one is dead-lettered as poison, undecoded"`
	HTTPAddr         string        `envconfig:"HTTP_ADDR" default:":8080" desc:"address of /healthz, /readyz and /metrics; empty to serve none"`
	Pprof            bool          `envconfig:"PPROF" default:"false" desc:"serve Go's /debug/pprof on PPROF_ADDR, for profiling"`
	PprofAddr        string        `envconfig:"PPROF_ADDR" default:"127.0.0.1:6060" desc:"address of /debug/pprof when PPROF=true; loopback by default: profiles are not for whoever reaches HTTP_ADDR"`
	InboxTTL         time.Duration `envconfig:"INBOX_TTL" default:"720h" desc:"how long an applied eventId is remembered (adr/0003); older rows are pruned"`
	PruneInterval    time.Duration `envconfig:"PRUNE_INTERVAL" default:"1m" desc:"how often retention runs (one replica at a time)"`
	PruneBatch       int           `envconfig:"PRUNE_BATCH" default:"5000" desc:"inbox rows deleted per statement"`
	ReconcileEvery   time.Duration `envconfig:"RECONCILE_INTERVAL" default:"1m" desc:"how often the service reconciles balances with transfers and looks for duplicate intents and stuck transitions (one replica at a time, adr/0007): a pass reads what arrived since the one before and the last RECONCILE_WINDOW's transfers; 0 never"`
	ReconcileWindow  time.Duration `envconfig:"RECONCILE_WINDOW" default:"1h" desc:"two creations of one intent (same accounts, amount, currency) under different transferIds at most this far apart are a suspected duplicate"`
	PendingAfter     time.Duration `envconfig:"RECONCILE_PENDING_AFTER" default:"1h" desc:"a transition waiting for its creation longer than this is reported"`
	ReconcileFull    time.Duration `envconfig:"RECONCILE_FULL_INTERVAL" default:"168h" desc:"how often a full reconciliation sums every transfer ever made; the periodic ones between add what arrived since the last (adr/0007); 0: only when the checkpoint cannot be trusted"`
	ReconcileDBURL   string        `envconfig:"RECONCILE_DATABASE_URL" desc:"a standby of the database where the scheduled full reconciliation reads, so that the primary does not pay for it (it writes what it found on the primary); empty: on DATABASE_URL"`
	ReconcileDLQ     bool          `envconfig:"RECONCILE_DLQ" default:"false" desc:"the periodic reconciliation also counts dead letters older than INBOX_TTL (needs read on PREFIX.dlq, as dlq list)"`
	JournalStream    string        `envconfig:"JOURNAL_STREAM" desc:"name of a RabbitMQ stream in which the service journals every event before its ack, so that what a database loses after the ack (a failover to a standby that was behind, a point-in-time restore) is applied again from it (adr/0014); empty: no journal"`
	JournalMaxAge    string        `envconfig:"JOURNAL_MAX_AGE" default:"7D" desc:"the journal stream's x-max-age (a number and Y, M, D, h, m or s): it must cover the furthest back a restore can go"`
	JournalMaxBytes  int64         `envconfig:"JOURNAL_MAX_BYTES" default:"0" desc:"the journal stream's x-max-length-bytes; 0 sets none (the age alone bounds it)"`
	JournalClockSkew time.Duration `envconfig:"JOURNAL_CLOCK_SKEW" default:"1m" desc:"how far apart the database server's clock and the broker's may be: a read of the journal starts this long before the database's mark last moved, and passes over every queue's entries of that stretch; clocks further apart cost a read from the stream's start, not a loss (adr/0014)"`
	JournalKeepAfter time.Duration `envconfig:"JOURNAL_KEEP_AFTER" default:"3s" desc:"how long a transaction's journal entries may wait for the stream's confirm before they are kept in the database instead and their events acked (a broker alarm, a stream unavailable), to go to the stream once it takes them again; at once while the broker blocks publishing (adr/0014)"`
	LogLevel         string        `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
	LogFormat        string        `envconfig:"LOG_FORMAT" default:"json" desc:"json or text"`
}

// Load reads every setting from the environment and checks it: an error
// names the variable and says what form its value should have, and never
// quotes a password.
func Load() (Config, error) {
	var c Config
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
	if err := c.validate(); err != nil {
		return c, err
	}
	_, err := LoadTracing()
	return c, err
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
func (c Config) validate() error {
	bad := func(name, format string, a ...any) error {
		return fmt.Errorf("configuration: %s: %s", name, fmt.Sprintf(format, a...))
	}
	if _, err := c.BrokerURLs(); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if _, err := c.Database(); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if _, err := c.ReconcileDatabase(); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if _, err := c.management(); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if err := c.checkTLSFiles(); err != nil { // tlsfiles.go
		return fmt.Errorf("configuration: %w", err)
	}
	if _, err := consumer.NewProducers(c.Producers, c.Replayers); err != nil {
		return bad("PRODUCERS/REPLAYERS", "%v", err)
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
	case c.ReconcileFull < 0:
		return bad("RECONCILE_FULL_INTERVAL", "must not be negative (0: only when the checkpoint cannot be trusted), got %s", c.ReconcileFull)
	case c.ReconcileFull > 0 && c.ReconcileFull < c.ReconcileEvery:
		return bad("RECONCILE_FULL_INTERVAL", "must not be shorter than RECONCILE_INTERVAL (%s), got %s", c.ReconcileEvery, c.ReconcileFull)
	case c.DBMaxConns < 0:
		return bad("DB_MAX_CONNS", "must not be negative, got %d", c.DBMaxConns)
	case c.BatchMax < 1 || c.BatchMax > maxBatch:
		return bad("BATCH_MAX", "must be between 1 and %d, got %d", maxBatch, c.BatchMax)
	case c.MaxBodyBytes < 1024 || c.MaxBodyBytes > 128<<20:
		return bad("MAX_BODY_BYTES", "must be between 1024 and %d, got %d", 128<<20, c.MaxBodyBytes)
	case c.BatchLinger < 0 || c.BatchLinger > time.Second:
		return bad("BATCH_LINGER", "must be between 0 and 1s, got %s", c.BatchLinger)
	case c.JournalStream != "" && c.namesTopology(c.JournalStream):
		return bad("JOURNAL_STREAM", "must not name an exchange or queue of the topology, got %q", c.JournalStream)
	case !maxAge.MatchString(c.JournalMaxAge):
		return bad("JOURNAL_MAX_AGE", "must be a number and one of Y, M, D, h, m, s (e.g. 7D), got %q", c.JournalMaxAge)
	case c.JournalMaxBytes < 0:
		return bad("JOURNAL_MAX_BYTES", "must not be negative, got %d", c.JournalMaxBytes)
	case c.JournalClockSkew < time.Second || c.JournalClockSkew > 24*time.Hour:
		return bad("JOURNAL_CLOCK_SKEW", "must be between 1s and 24h, got %s", c.JournalClockSkew)
	case c.JournalKeepAfter < 10*time.Millisecond || c.JournalKeepAfter > time.Minute:
		return bad("JOURNAL_KEEP_AFTER", "must be between 10ms and 1m, got %s", c.JournalKeepAfter)
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		return bad("LOG_LEVEL", "must be debug, info, warn or error, got %q", c.LogLevel)
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		return bad("LOG_FORMAT", "must be json or text, got %q", c.LogFormat)
	}
	return nil
}

// namesTopology reports whether name is the hash exchange's, the
// dead-letter exchange's or queue's, or a partition queue's.
func (c Config) namesTopology(name string) bool {
	p := c.Prefix
	if name == p || name == p+".dlx" || name == p+".dlq" {
		return true
	}
	rest, ok := strings.CutPrefix(name, p+".")
	_, err := strconv.Atoi(rest)
	return ok && err == nil
}

// maxAge is the form of a stream's x-max-age.
var maxAge = regexp.MustCompile(`^[1-9][0-9]*[YMDhms]$`)

// maxBatch bounds BATCH_MAX: a batch's transaction holds the locks of all
// its events until the commit, and its events wait for each other; beyond
// a few hundred nothing more is amortised (adr/0006).
const maxBatch = 500

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}

// Level returns LOG_LEVEL, which Load checked.
func (c Config) Level() slog.Level {
	l, _ := parseLevel(c.LogLevel)
	return l
}
