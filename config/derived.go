package config

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/journal"
	"transferconsumer/retry"
	"transferconsumer/topology"
)

// What the settings make for the parts of the service they configure.

// Instance is INSTANCE_NAME, else HOSTNAME-PID.
func (c Config) Instance() string {
	if c.InstanceName != "" {
		return c.InstanceName
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// DebugAddr is where /debug/pprof is served: nowhere ("") unless PPROF=true.
func (c Config) DebugAddr() string {
	if !c.Pprof {
		return ""
	}
	return c.PprofAddr
}

// PoolSize is the database pool's size: DB_MAX_CONNS, else QUEUE_COUNT+4.
func (c Config) PoolSize() int {
	if c.DBMaxConns > 0 {
		return c.DBMaxConns
	}
	// One per consuming queue, plus the prune job, the readiness ping and the
	// oldest-row gauge, so that none of them makes a consumer wait.
	return c.QueueCount + 4
}

// Reconnect is the backoff between reconnects to the broker or database.
func (c Config) Reconnect() retry.Backoff {
	return retry.Backoff{Min: c.ReconnectMin, Max: c.ReconnectMax}
}

// Topology is the broker topology the settings name.
func (c Config) Topology() topology.Spec {
	return topology.Spec{Prefix: c.Prefix, Queues: c.QueueCount, DeliveryLimit: c.DeliveryLimit}
}

// Consumer is the consumer's configuration, logging to log; the hooks
// (Observe, Tracer, …) are left for the caller to set.
func (c Config) Consumer(log *slog.Logger) consumer.Config {
	urls, _ := c.BrokerURLs() // validated at load; a file is read again at each dial
	mgmt, _ := c.management() // validated at load
	var urlsFunc func() ([]string, error)
	if c.AMQPURLFile != "" {
		urlsFunc = c.BrokerURLs
	}
	producers, _ := consumer.NewProducers(c.Producers, c.Replayers) // validated at load
	return consumer.Config{
		URLs:            urls,
		URLsFunc:        urlsFunc,
		Topology:        c.Topology(),
		Declare:         c.DeclareTopology,
		Management:      mgmt,
		Instance:        c.Instance(),
		ReplicaIndex:    c.ReplicaIndex,
		ReplicaCount:    c.ReplicaCount,
		ShutdownTimeout: c.ShutdownTimeout,
		ApplyTimeout:    c.ApplyTimeout,
		BatchMax:        c.BatchMax,
		BatchLinger:     c.BatchLinger,
		MaxBodyBytes:    c.MaxBodyBytes,
		Producers:       producers,
		Retry:           retry.Backoff{Min: c.RetryMin, Max: c.RetryMax},
		Reconnect:       c.Reconnect(),
		Logger:          log,
	}
}

// Summary is what the start-up log line says of the settings: where the
// service connects (credentials hidden), to which hosts, and the settings
// an operator looks for first.
func (c Config) Summary() []any {
	amqpURLs, _ := c.BrokerURLs() // checked by Load: here for the log line alone
	dbURL, _ := c.Database()
	var hosts string
	if dsn, err := db.ParseDSN(dbURL); err == nil {
		hosts = strings.Join(dsn.Hosts(), ",")
	}
	attrs := []any{"instance", c.Instance(), "amqp_url", Redact(strings.Join(amqpURLs, ",")),
		"database_url", Redact(dbURL), "database_hosts", hosts,
		"queues", c.QueueCount, "prefix", c.Prefix, "migrate", c.Migrate}
	if c.AMQPURLFile != "" {
		attrs = append(attrs, "amqp_url_file", c.AMQPURLFile)
	}
	if c.DatabaseURLFile != "" {
		attrs = append(attrs, "database_url_file", c.DatabaseURLFile)
	}
	if c.RequireSync {
		attrs = append(attrs, "require_sync_standby", true)
	}
	if c.ManagementURL != "" {
		attrs = append(attrs, "management_url", Redact(c.ManagementURL))
	}
	if c.MgmtURLFile != "" {
		attrs = append(attrs, "management_url_file", c.MgmtURLFile)
	}
	if !c.DeclareTopology {
		attrs = append(attrs, "declare_topology", false)
	}
	if c.ReconcileDBURL != "" {
		attrs = append(attrs, "reconcile_database_url", Redact(c.ReconcileDBURL))
	}
	return attrs
}

// Journal is the journal's configuration (JOURNAL_STREAM, adr/0014): its
// stream, declared like the topology, on a connection of its own.
func (c Config) Journal() journal.Config {
	return journal.Config{
		Stream: c.JournalStream, MaxAge: c.JournalMaxAge, MaxBytes: c.JournalMaxBytes, Declare: c.DeclareTopology,
		KeepAfter: c.JournalKeepAfter, Skew: c.JournalClockSkew,
		Dial: func() (*amqp.Connection, error) {
			urls, err := c.BrokerURLs()
			if err != nil {
				return nil, err
			}
			conn, _, err := consumer.Dial(urls, 0, c.Instance()+"-journal")
			return conn, err
		},
	}
}
