// Command transferconsumer reads transfer events from RabbitMQ and applies
// each one to PostgreSQL effectively once: an insert-first inbox claim and
// the balance change share one local transaction, and the ack follows the
// commit (see adr/0001). Run it with no arguments to consume until SIGTERM or
// SIGINT; "migrate" and "topology" do one set-up step alone; "--help" lists
// the environment variables.
//
// This file only wires: the command line is package cli, the settings
// package config, the health, metrics, logs and traces package observe.
package main

import (
	"context"
	"embed"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"transferconsumer/cli"
	"transferconsumer/config"
	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/event"
	"transferconsumer/journal"
	"transferconsumer/observe"
)

//go:embed sql/*.sql sql/functions/*.sql
var embedded embed.FS

func main() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(config.DefaultGCPercent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err := run(ctx, os.Args[1:])
	// Before the exit: the cancel requests of queries that shutdown ended
	// (db.WaitForSockets says why).
	db.WaitForSockets(5 * time.Second)
	if err != nil {
		if cli.Found(err) {
			os.Exit(cli.ExitFound) // reconcile: its report says what it found
		}
		fmt.Fprintln(os.Stderr, "error:", err)
		if cli.Unseen(err) {
			os.Exit(cli.ExitUnseen) // reconcile --require-dlq: the DLQ was not read whole
		}
		os.Exit(1)
	}
}

// run runs the command line args with the migrations embedded in the
// binary, serving the service for the run command.
func run(ctx context.Context, args []string) error {
	migrations, err := fs.Sub(embedded, "sql")
	if err != nil {
		return err
	}
	app := cli.App{Migrations: migrations, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}
	app.Serve = func(ctx context.Context, cfg config.Config) error { return serve(ctx, cfg, migrations, os.Stderr) }
	return app.Run(ctx, args)
}

// serve connects to the database (waiting for it while it is unreachable),
// checks that its schema is current, migrating it when it may (MIGRATE),
// waits for as long as it is not, and consumes until ctx ends, with the
// health and metrics server, answering from the first instant, and the
// inbox retention job beside the consumer.
func serve(ctx context.Context, cfg config.Config, migrations fs.FS, stderr io.Writer) error {
	log, closeLog := observe.NewLogger(stderr, cfg.Level(), cfg.LogFormat)
	defer closeLog()
	log.Info("starting", cfg.Summary()...)
	h := &observe.Health{}
	m := observe.NewMetrics(h, cfg)
	var wg sync.WaitGroup
	defer wg.Wait()
	jobs, stopJobs := context.WithCancel(ctx)
	defer stopJobs()
	for _, srv := range []struct {
		addr, name string
		serve      func(net.Listener)
	}{
		{cfg.HTTPAddr, "HTTP_ADDR", func(ln net.Listener) { observe.Serve(jobs, ln, h, m, log) }},
		{cfg.DebugAddr(), "PPROF_ADDR", func(ln net.Listener) { observe.ServePprof(jobs, ln, log) }},
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
	h.Replication(replication)
	// With the journal, every new database connection (a reconnect, after
	// a failover or a restore) has each queue's mark compared with the
	// journal's, idle queues' too (adr/0014).
	var jr *journal.Journal
	var svc *consumer.Service // the journal's lanes report to it; they open once it runs
	if cfg.JournalStream != "" {
		jcfg := cfg.Journal()
		jcfg.Reports = journal.Reports{Restored: m.Restored, Unprotected: m.Unprotected, Lost: m.JournalLost, Read: m.JournalRead, Held: m.JournalHeld,
			Stalled: func(q string, since time.Time, attempts int, id string, err error) {
				m.JournalStalled(q, attempts)
				svc.JournalStalled(q, since, attempts, id, err)
			},
			Healed: func(q string) { svc.JournalHealed(q) }}
		jr = journal.New(jcfg)
		defer jr.Close()
	}
	database, err := db.OpenWhenReady(ctx, cfg.Database, cfg.Migrate, cfg.PoolSize(), cfg.Reconnect(), log,
		func(err error) { h.Starting("%v", err) }, db.WatchReplication(replication), db.OnConnect(func() {
			if jr != nil {
				jr.CheckNow()
			}
		}))
	if err != nil {
		return nil // ctx ended: stopped while waiting
	}
	defer database.Close()
	if err := replication.WaitSynchronous(ctx, database, db.ReplicationEvery, func(err error) { h.Starting("%v", err) }); err != nil {
		return nil
	}
	h.Database(database)
	wg.Add(1)
	go func() { defer wg.Done(); replication.Run(jobs, database, db.ReplicationEvery) }()
	if err := db.SchemaWhenReady(ctx, database, migrations, cfg.Migrate, cfg.Reconnect(), log, h.SchemaWaiting); err != nil {
		return nil
	}
	h.SchemaCurrent()

	tracing, err := config.LoadTracing() // checked by config.Load
	if err != nil {
		return err
	}
	tracer, stopTracing, err := observe.NewTracer(ctx, tracing)
	if err != nil {
		return err
	}
	defer func() {
		flush, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = stopTracing(flush)
	}()

	ccfg := cfg.Consumer(log)
	ccfg.Producers.Log(log)
	ccfg.Observe = m.Decided
	ccfg.ObserveRetry = m.Retried
	ccfg.ObserveBatch = m.Batch
	ccfg.Tracer = tracer
	inbox := db.NewInbox(database)
	if jr != nil {
		jr.Use(inbox) // where entries wait while the stream does not take them
		// Every queue is compared with the journal, and restored, in one
		// read of the stream before any is consumed (adr/0014).
		queues := make([]string, cfg.QueueCount)
		for i := range queues {
			queues[i] = cfg.Topology().Queue(i)
		}
		jr.RestoreAtStart(ctx, queues, func() event.MarkedLane { return inbox.Lane(cfg.ApplyTimeout).(event.MarkedLane) }, log)
		ccfg.Journal = func(queue string, l event.Lane) event.Lane {
			return jr.Wrap(queue, l.(event.MarkedLane), log) // the database's lanes are
		}
		ccfg.JournalReadable = jr.Readable
	}
	svc = consumer.New(ccfg, inbox)
	if jr != nil {
		wg.Add(1)
		go func() { defer wg.Done(); jr.Watch(jobs, journal.CheckEvery, log) }()
	}
	h.Service(svc)

	wg.Add(1)
	go func() { defer wg.Done(); cli.PruneLoop(jobs, database, cfg, m, log) }()
	wg.Add(1)
	go func() { defer wg.Done(); cli.ReconcileLoop(jobs, database, cfg, m, log) }()

	if err := svc.Run(ctx); err != nil {
		return fmt.Errorf("broker topology: %w", err)
	}
	return nil
}
