// Command transferconsumer reads transfer events from RabbitMQ and applies
// each one to PostgreSQL effectively once: an insert-first inbox claim and
// the balance change share one local transaction, and the ack follows the
// commit (see adr/0001). Run it with no arguments to consume until SIGTERM or
// SIGINT; "migrate" and "topology" do one set-up step alone; "--help" lists
// the environment variables.
package main

import (
	"context"
	"embed"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"transferconsumer/consumer"
	"transferconsumer/db"
)

//go:embed sql/*.sql
var embedded embed.FS

func main() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if found(err) {
			os.Exit(exitFound) // reconcile: its report says what it found
		}
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// defaultGCPercent is the garbage collector's target when GOGC is not set.
// The service's live heap is about a megabyte, under the runtime's 4 MB
// minimum, so at Go's default of 100 it collects every 4 MB allocated,
// about every 600 events; each cycle scans the same globals and goroutine
// stacks, which makes the cost per cycle nearly fixed. At 400 the heap may
// grow to 16 MB between cycles (peak RSS about 30 MiB at 32 queues instead
// of 21) and a quarter of the cycles run (BENCHMARKS.md).
const defaultGCPercent = 400

const usageText = `Usage: transferconsumer [command]

Commands:
  (none), run          consume every partition queue until SIGTERM or SIGINT
  migrate [--grant-to ROLE]
                       create or update the database schema, then exit (see migrate --help)
  topology             declare the exchanges, queues and bindings, then exit
  prune                delete inbox rows older than INBOX_TTL, then exit
  repartition --to N   add queues up to N without reordering accounts (see repartition --help)
  dlq list [flags]     count the dead letters by class and reason, show the first ones
  dlq replay [flags]   put dead letters back on the exchange (see dlq replay --help)
  dlq drop [flags]     remove dead letters for good, each written to a record first (see dlq drop --help)
  reconcile [flags]    prove every balance from the transfers, report suspected duplicate
                       intents and stuck transitions; exit 3 when it finds any (see reconcile --help)
  help                 print this text

`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := "run"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usageText)
		return printUsage(stdout)
	case "run", "migrate", "topology", "prune", "repartition", "dlq", "reconcile":
	default:
		return fmt.Errorf("unknown command %q (try --help)", cmd)
	}
	if cmd != "dlq" && cmd != "repartition" && cmd != "migrate" && cmd != "reconcile" && len(args) > 0 {
		return fmt.Errorf("%s takes no arguments, got %q", cmd, args)
	}
	var dlqCmd dlqArgs
	var grantTo string
	var reconcileCmd reconcileArgs
	// Before the configuration: help and a wrong flag need neither it nor
	// the broker or the database.
	switch cmd {
	case "dlq":
		var err error
		if dlqCmd, err = parseDLQ(args, stdout); err != nil {
			return flagErr(err)
		}
	case "migrate":
		var err error
		if grantTo, err = parseMigrate(args, stdout); err != nil {
			return flagErr(err)
		}
	case "reconcile":
		var err error
		if reconcileCmd, err = parseReconcile(args, stdout); err != nil {
			return flagErr(err)
		}
	}

	cfg, err := loadConfig()
	if err != nil {
		return err
	}
	log, closeLog, err := newLogger(cfg, stderr)
	if err != nil {
		return err
	}
	defer closeLog()
	migrations, err := fs.Sub(embedded, "sql")
	if err != nil {
		return err
	}
	switch cmd {
	case "migrate":
		return migrateCommand(ctx, cfg, migrations, grantTo, stdout)
	case "topology":
		return topologyCommand(cfg, stdout)
	case "prune":
		return pruneCommand(ctx, cfg, stdout)
	case "dlq":
		return dlqCommand(cfg, dlqCmd, os.Stdin, stdout, stderr)
	case "repartition":
		return repartitionCommand(ctx, cfg, args, stdout)
	case "reconcile":
		return reconcileCommand(ctx, cfg, migrations, reconcileCmd, stdout)
	}
	return serve(ctx, cfg, log, migrations)
}

// replicationEvery is how often the service reads again whether the
// database has a synchronous standby, besides at each new connection.
const replicationEvery = 10 * time.Second

// databaseHosts returns the hosts of the database setting, for the log.
func databaseHosts(setting string) string {
	dsn, err := db.ParseDSN(setting)
	if err != nil {
		return ""
	}
	return strings.Join(dsn.Hosts(), ",")
}

// serve connects to the database (waiting for it while it is unreachable),
// checks that its schema is current, migrating it when it may (MIGRATE),
// waits for as long as it is not, and consumes until ctx ends, with the
// health and metrics server, answering from the first instant, and the
// inbox retention job beside the consumer.
func serve(ctx context.Context, cfg config, log *slog.Logger, migrations fs.FS) error {
	amqpURLs, _ := cfg.brokerURLs() // checked by loadConfig: here for the log line alone
	dbURL, _ := cfg.databaseURL()
	attrs := []any{"instance", cfg.instance(), "amqp_url", redact(strings.Join(amqpURLs, ",")),
		"database_url", redact(dbURL), "database_hosts", databaseHosts(dbURL), "queues", cfg.QueueCount, "prefix", cfg.Prefix, "migrate", cfg.Migrate}
	if cfg.AMQPURLFile != "" {
		attrs = append(attrs, "amqp_url_file", cfg.AMQPURLFile)
	}
	if cfg.DatabaseURLFile != "" {
		attrs = append(attrs, "database_url_file", cfg.DatabaseURLFile)
	}
	if cfg.RequireSync {
		attrs = append(attrs, "require_sync_standby", true)
	}
	if cfg.ManagementURL != "" {
		attrs = append(attrs, "management_url", redact(cfg.ManagementURL))
	}
	if cfg.MgmtURLFile != "" {
		attrs = append(attrs, "management_url_file", cfg.MgmtURLFile)
	}
	if !cfg.DeclareTopology {
		attrs = append(attrs, "declare_topology", false)
	}
	log.Info("starting", attrs...)
	h := &health{}
	m := newMetrics(h, cfg)
	var wg sync.WaitGroup
	defer wg.Wait()
	jobs, stopJobs := context.WithCancel(ctx)
	defer stopJobs()
	for _, srv := range []struct {
		addr, name string
		serve      func(net.Listener)
	}{
		{cfg.HTTPAddr, "HTTP_ADDR", func(ln net.Listener) { serveHTTP(jobs, ln, h, m, log) }},
		{cfg.pprofAddr(), "PPROF_ADDR", func(ln net.Listener) { servePprof(jobs, ln, log) }},
	} {
		if srv.addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", srv.addr) // closed by the server's shutdown when jobs end
		if err != nil {
			return fmt.Errorf("%s: %w", srv.name, err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); srv.serve(ln) }()
	}

	// With MIGRATE=false the service creates no database either: it
	// changes nothing of the database's structure. Each new connection
	// reads whether a standby is synchronous (a failover may lose acked
	// events otherwise, adr/0001); REQUIRE_SYNC_STANDBY waits for one.
	replication := db.NewReplicationWatch(cfg.RequireSync, log)
	h.replication.Store(replication)
	database, err := db.OpenWhenReady(ctx, cfg.databaseURL, cfg.Migrate, cfg.dbMaxConns(), cfg.backoff(), log,
		func(err error) { h.setStarting("%v", err) }, db.WatchReplication(replication))
	if err != nil {
		return nil // ctx ended: stopped while waiting
	}
	defer database.Close()
	if err := replication.WaitSynchronous(ctx, database, replicationEvery, func(err error) { h.setStarting("%v", err) }); err != nil {
		return nil
	}
	h.database.Store(database)
	wg.Add(1)
	go func() { defer wg.Done(); replication.Run(jobs, database, replicationEvery) }()
	if err := db.SchemaWhenReady(ctx, database, migrations, cfg.Migrate, cfg.backoff(), log, h.schemaWaiting); err != nil {
		return nil
	}
	h.schemaCurrent()

	tracer, stopTracing, err := newTracer(ctx)
	if err != nil {
		return err
	}
	defer func() {
		flush, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = stopTracing(flush)
	}()

	ccfg := cfg.consumerConfig(log)
	ccfg.Observe = m.decided
	ccfg.ObserveRetry = m.retried
	ccfg.ObserveBatch = func(n int) { m.batches.Observe(float64(n)) }
	ccfg.Tracer = tracer
	svc := consumer.New(ccfg, db.NewInbox(database))
	h.svc.Store(svc)

	wg.Add(1)
	go func() { defer wg.Done(); pruneLoop(jobs, database, cfg, m, log) }()
	wg.Add(1)
	go func() { defer wg.Done(); reconcileLoop(jobs, database, cfg, m, log) }()

	if err := svc.Run(ctx); err != nil {
		return fmt.Errorf("broker topology: %w", err)
	}
	return nil
}
