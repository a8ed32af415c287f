package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	"transferconsumer/config"
	"transferconsumer/db"
	"transferconsumer/dlq"
	"transferconsumer/observe"
	"transferconsumer/reconcile"
)

const reconcileUsage = `Usage: transferconsumer reconcile [--periodic | --rebuild] [--json] [-n N] [--skip-dlq | --require-dlq [--dlq-wait D]]

Reads the database in one consistent snapshot and reports (adr/0007):
  - every account whose balance is not the net of its transfers (drift);
  - every account whose transfers no longer sum to what the checkpoint of
    the periodic passes says: a transfer it counted was changed or removed
    by hand (changed). A pass that writes keeps each, and every pass after
    reports it, until a person resolves it (reconcile_resolved);
  - creations of one intent (the same accounts, amount and currency) under
    different transferIds within RECONCILE_WINDOW: suspected duplicates a
    producer published, which the inbox cannot see;
  - transitions waiting for their creation longer than RECONCILE_PENDING_AFTER;
  - dead letters older than INBOX_TTL (or with no failure time), whose
    replay the inbox can no longer prove harmless. The DLQ is read as
    dlq list reads it and left as it was; when the broker cannot be read
    the report says so and the rest stands, unless --require-dlq.
    Letters another reader holds unacknowledged cannot be read: with
    MANAGEMENT_URL set, the report compares what it read with the broker's
    count and says how many it did not see; with --require-dlq it reads
    again, for up to --dlq-wait, until it sees them all.

By default it is a full pass over every transfer, and changes nothing: it
runs on a standby too. --periodic runs the service's periodic pass once:
from the checkpoint, the transfers committed since its cut-off (a full pass
when the checkpoint cannot be trusted, or RECONCILE_FULL_INTERVAL has
passed), then it moves the checkpoint and writes what it found, and
reports every finding not yet resolved. --rebuild is a full pass that makes
the checkpoint anew and writes what it found. Both write, so they need the
primary, and wait for no other replica's pass: they fail while one runs.

Exit status: 0 when nothing was found, 3 when something was, 4 when
--require-dlq could not see every dead letter the broker counts, 1 on an
error.
`

// ExitFound is reconcile's exit status when it found something to look into:
// distinct from 1, an error, so that a job or a script can tell them apart.
const ExitFound = 3

// ExitUnseen is reconcile's exit status when --require-dlq could not see
// every dead letter the broker counts (another reader held them for all of
// --dlq-wait): its verdict on the letters is not whole.
const ExitUnseen = 4

// unseenError is reconcile's answer when --require-dlq read only part of
// the DLQ.
type unseenError struct{ dlqCount dlqCount }

func (e unseenError) Error() string {
	return "reconcile: the dead-letter queue was not read whole (--require-dlq): " + e.dlqCount.String()
}

// Unseen reports whether err is reconcile's "the DLQ was not read whole":
// the caller prints it and exits with ExitUnseen.
func Unseen(err error) bool {
	_, ok := errors.AsType[unseenError](err)
	return ok
}

// foundError is reconcile's answer when its report shows findings; the
// report has said what, so main prints nothing more.
type foundError struct{ kinds int }

func (e foundError) Error() string {
	return fmt.Sprintf("reconcile found %d kind(s) of finding", e.kinds)
}

// Found reports whether err is reconcile's "found something": the report
// has said what, so the caller exits with ExitFound and prints nothing more.
func Found(err error) bool {
	_, ok := errors.AsType[foundError](err)
	return ok
}

// pass is which reconciliation a run is (adr/0007).
type pass int

const (
	passFull     pass = iota // every transfer, read only
	passPeriodic             // from the checkpoint, recorded
	passRebuild              // every transfer, the checkpoint made anew, recorded
)

// reconcileArgs is a parsed reconcile command line.
type reconcileArgs struct {
	json    bool
	pass    pass
	first   int           // findings of each kind shown
	dlqRead string        // read, skip or require
	dlqWait time.Duration // require: how long to read again for letters another reader holds
}

func parseReconcile(args []string, help io.Writer) (reconcileArgs, error) {
	a := reconcileArgs{dlqRead: "read"}
	fset := flag.NewFlagSet("reconcile", flag.ContinueOnError)
	fset.SetOutput(io.Discard)
	fset.Usage = func() {}
	fset.BoolVar(&a.json, "json", false, "print the report as JSON")
	periodic := fset.Bool("periodic", false, "run the service's periodic pass once, from the checkpoint, and write what it found (needs the primary)")
	rebuild := fset.Bool("rebuild", false, "a full pass that makes the checkpoint anew and writes what it found (needs the primary)")
	fset.IntVar(&a.first, "n", 20, "findings of each kind to show (all are counted)")
	skip := fset.Bool("skip-dlq", false, "do not read the dead-letter queue")
	require := fset.Bool("require-dlq", false, "fail (exit 1) when the dead-letter queue cannot be read, and (exit 4) when it cannot be read whole")
	fset.DurationVar(&a.dlqWait, "dlq-wait", 30*time.Second, "with --require-dlq: how long to read again while another reader holds dead letters")
	err := fset.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintf(help, "%s\nFlags:\n", reconcileUsage)
		fset.SetOutput(help)
		fset.PrintDefaults()
		return a, err
	case err != nil:
		return a, fmt.Errorf("reconcile: %v\n\n%s", err, reconcileUsage)
	case fset.NArg() > 0:
		return a, fmt.Errorf("reconcile takes no arguments, got %q\n\n%s", fset.Args(), reconcileUsage)
	case a.first < 0:
		return a, fmt.Errorf("reconcile: -n must not be negative, got %d\n\n%s", a.first, reconcileUsage)
	case a.dlqWait < 0:
		return a, fmt.Errorf("reconcile: --dlq-wait must not be negative, got %s\n\n%s", a.dlqWait, reconcileUsage)
	case *skip && *require:
		return a, fmt.Errorf("reconcile: --skip-dlq and --require-dlq contradict each other\n\n%s", reconcileUsage)
	case *periodic && *rebuild:
		return a, fmt.Errorf("reconcile: --periodic and --rebuild contradict each other\n\n%s", reconcileUsage)
	case *skip:
		a.dlqRead = "skip"
	case *require:
		a.dlqRead = "require"
	}
	switch {
	case *periodic:
		a.pass = passPeriodic
	case *rebuild:
		a.pass = passRebuild
	}
	return a, nil
}

// reconcileReport is a whole reconciliation: the database's snapshot and,
// when read, the dead-letter queue.
type reconcileReport struct {
	reconcile.Reconciliation
	Duration    time.Duration
	Window      time.Duration
	After       time.Duration
	InboxTTL    time.Duration
	DeadLetters deadLetters
}

// deadLetters is what reconcile saw of the dead-letter queue.
type deadLetters struct {
	Read        bool         `json:"read"`
	Error       string       `json:"error,omitempty"` // why it was not read
	Total       int          `json:"total"`
	Old         int          `json:"older_than_inbox_ttl"`
	Undated     int          `json:"undated"`
	Letters     []deadLetter `json:"letters"` // the first old or undated ones
	BrokerCount dlqCount     `json:"sight"`   // the broker's count against what the read got (the key is kept for existing readers)
}

type deadLetter struct {
	EventID    string     `json:"event_id"`
	Class      string     `json:"class"`
	Reason     string     `json:"reason"`
	Queue      string     `json:"queue"`
	RoutingKey string     `json:"routing_key"`
	DeadSince  *time.Time `json:"dead_since"` // nil: the letter shows no time
}

// findings returns how many kinds of finding r holds.
func (r reconcileReport) findings() int {
	n := 0
	for _, c := range []int{r.DriftCount, r.ChangedCount, r.DupCount, r.WaitCount, r.DeadLetters.Old + r.DeadLetters.Undated} {
		if c > 0 {
			n++
		}
	}
	return n
}

// dlqRead says whether a reconciliation reads the DLQ, and for whom.
type dlqRead int

const (
	dlqNone      dlqRead = iota
	dlqByCommand         // a person's command
	dlqByService         // the service's periodic run (readDeadLetters)
)

// runReconcile runs one reconciliation of kind p; with exclusive, only if no
// other replica's pass holds the lock (Ran says whether it did). It reads
// the DLQ too unless letters is dlqNone, again for up to dlqWait while
// another reader holds letters. A periodic pass is a full one when
// fullEvery (not 0) has passed since the last.
func runReconcile(ctx context.Context, database *sqlx.DB, cfg config.Config, first int, p pass, fullEvery time.Duration,
	exclusive bool, letters dlqRead, dlqWait time.Duration) (reconcileReport, error) {
	start := time.Now()
	rep := reconcileReport{Window: cfg.ReconcileWindow, After: cfg.PendingAfter, InboxTTL: cfg.InboxTTL}
	o := reconcile.Options{Window: cfg.ReconcileWindow, PendingAfter: cfg.PendingAfter, Limit: first, Exclusive: exclusive}
	var err error
	if p == passFull {
		rep.Reconciliation, err = reconcile.Full(ctx, database, o)
	} else {
		rep.Reconciliation, err = reconcile.Periodic(ctx, database, reconcile.PeriodicOptions{Options: o, FullEvery: fullEvery, Full: p == passRebuild})
	}
	if err != nil || !rep.Ran {
		return rep, err
	}
	rep.DeadLetters = deadLetters{Error: "not read: RECONCILE_DLQ is false"}
	if letters != dlqNone {
		rep.DeadLetters = readDeadLetters(cfg, first, dlqWait, letters == dlqByService)
	}
	rep.Duration = time.Since(start)
	return rep, nil
}

// readDeadLetters counts the dead letters that failed longer ago than
// INBOX_TTL, and those that show no time at all: replay leaves both alone
// (adr/0003), since the inbox may have forgotten an event they hold. It
// reads the DLQ as dlq list does, returning every letter in place, and
// again, for up to wait, while the broker counts letters it did not see.
//
// The service's periodic run (periodic) reads only where guardDLQ can look
// without a declare the user may not be allowed: through the management
// API, or with DECLARE_TOPOLOGY=true, whose declare at start already
// proved the DLQ's arguments the service's. Otherwise a refused declare
// would log a channel error on the broker at every run, and a read without
// the check could spend a letter's deliveries run after run.
func readDeadLetters(cfg config.Config, first int, wait time.Duration, periodic bool) deadLetters {
	if periodic && !cfg.DeclareTopology && cfg.Management() == nil {
		return deadLetters{Error: "not read: with DECLARE_TOPOLOGY=false the periodic run reads the DLQ only with MANAGEMENT_URL set, " +
			"to check without a declare that reading spends no delivery of its letters"}
	}
	conn, err := dial(cfg, "reconcile")
	if err != nil {
		return deadLetters{Error: "not read: " + err.Error()}
	}
	defer conn.Close()
	if err := guardDLQ(cfg, conn, false, io.Discard); err != nil {
		return deadLetters{Error: "not read: " + err.Error()}
	}
	s, seen, err := readWholeDLQ(cfg, wait, func() (dlq.Summary, int, error) {
		s, err := dlq.List(conn, cfg.Prefix, math.MaxInt)
		return s, s.Total, err
	})
	if err != nil {
		return deadLetters{Error: "not read: " + err.Error()}
	}
	d := deadLetters{Read: true, Total: s.Total, BrokerCount: seen}
	cutoff := time.Now().Add(-cfg.InboxTTL)
	for _, l := range s.Letters {
		since := l.DeadSince
		if since.IsZero() {
			since = l.FailedAt
		}
		switch {
		case since.IsZero():
			d.Undated++
		case since.Before(cutoff):
			d.Old++
		default:
			continue
		}
		if len(d.Letters) < first {
			dl := deadLetter{EventID: l.EventID, Class: l.Class, Reason: l.Reason, Queue: l.Queue, RoutingKey: l.RoutingKey}
			if !since.IsZero() {
				dl.DeadSince = &since
			}
			d.Letters = append(d.Letters, dl)
		}
	}
	return d
}

func reconcileCommand(ctx context.Context, cfg config.Config, migrations fs.FS, a reconcileArgs, stdout io.Writer) error {
	database, err := db.OpenFrom(ctx, cfg.Database, 2)
	if err != nil {
		return err
	}
	defer database.Close()
	// A schema without created_at would fail the queries with a message
	// about a column; this names what is missing.
	if missing, err := db.Pending(ctx, database, migrations); err != nil {
		return fmt.Errorf("reconcile: read the schema's migrations: %w", err)
	} else if len(missing) > 0 {
		return fmt.Errorf("reconcile: the schema lacks the migrations %v: run transferconsumer migrate first", missing)
	}
	wait := time.Duration(0)
	if a.dlqRead == "require" {
		wait = a.dlqWait
	}
	// A pass that writes takes the lock the service's passes take, so
	// that it never writes beside one of theirs.
	letters := dlqByCommand
	if a.dlqRead == "skip" {
		letters = dlqNone
	}
	rep, err := runReconcile(ctx, database, cfg, a.first, a.pass, fullEvery(cfg), a.pass != passFull, letters, wait)
	switch {
	case err != nil:
		return err
	case !rep.Ran:
		return fmt.Errorf("reconcile: another pass (a replica's periodic one) holds the reconciliation's lock: try again once it ended")
	}
	if a.dlqRead == "skip" {
		rep.DeadLetters.Error = "not read: --skip-dlq"
	}
	if a.json {
		err = printReconcileJSON(stdout, rep)
	} else {
		printReconcile(stdout, rep)
	}
	switch {
	case err != nil:
		return err
	case a.dlqRead == "require" && !rep.DeadLetters.Read:
		return fmt.Errorf("reconcile: the dead-letter queue could not be read (--require-dlq): %s", rep.DeadLetters.Error)
	case a.dlqRead == "require" && rep.DeadLetters.BrokerCount.Unseen > 0:
		return unseenError{rep.DeadLetters.BrokerCount}
	case rep.findings() > 0:
		return foundError{rep.findings()}
	}
	return nil
}

// ReconcileLoop is the reconcile command run by the service: it runs the
// periodic pass every RECONCILE_INTERVAL until ctx ends, the first time a
// minute after start (or sooner, with a shorter interval), so that a
// replica restarted more often than the interval still reports. Each pass
// starts from the checkpoint the one before left; it is a full pass when
// the checkpoint cannot be trusted, and, without RECONCILE_DATABASE_URL,
// when RECONCILE_FULL_INTERVAL has passed since the last (with it, the
// scheduled full pass reads the standby: fullOnStandby). Replicas take
// turns through a transaction-scoped advisory lock, as retention does: a
// run that finds another running does nothing. A failed run is logged and
// retried at the next tick.
func ReconcileLoop(ctx context.Context, database *sqlx.DB, cfg config.Config, m *observe.Metrics, log *slog.Logger) {
	if cfg.ReconcileEvery <= 0 {
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	if standby, _ := cfg.ReconcileDatabase(); standby != "" && cfg.ReconcileFull > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); fullOnStandby(ctx, database, standby, cfg, log) }()
	}
	wait := min(cfg.ReconcileEvery, time.Minute)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = cfg.ReconcileEvery
		// A bound, so that a pass on an overloaded server cannot hold
		// its snapshot (and vacuum's horizon with it) for ever; never
		// tighter than ten minutes, whatever a short interval says, and a
		// day for a pass that may be a full one.
		run, cancel := context.WithTimeout(ctx, fullBound(cfg))
		letters := dlqNone
		if cfg.ReconcileDLQ {
			letters = dlqByService
		}
		rep, err := runReconcile(run, database, cfg, logFirst, passPeriodic, fullEvery(cfg), true, letters, 0)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			log.Error("reconcile failed", "err", err)
		case err == nil && rep.Ran:
			m.Reconciled(observe.Reconciliation{Drift: rep.DriftCount, Duplicates: rep.DupCount, Waiting: rep.WaitCount,
				Changed: rep.ChangedCount, OldLetters: oldLetters(rep.DeadLetters), Took: rep.Duration, Full: rep.Full,
				LastFull: lastFull(rep.Reconciliation), OldestFinding: rep.OldestFinding, Checkpoint: rep.Checkpoint.TrustReason()})
			logReconcile(log, rep)
		}
	}
}

// fullEvery is how often the periodic run is a full pass on the primary:
// RECONCILE_FULL_INTERVAL, or never when a standby takes the scheduled
// full pass (RECONCILE_DATABASE_URL).
func fullEvery(cfg config.Config) time.Duration {
	if standby, _ := cfg.ReconcileDatabase(); standby != "" {
		return 0
	}
	return cfg.ReconcileFull
}

// fullBound bounds a pass that may be a full one: a day, or the interval
// when longer. A full pass over billions of transfers takes hours; one that
// cannot end within a day belongs on a standby (RECONCILE_DATABASE_URL).
func fullBound(cfg config.Config) time.Duration {
	return max(cfg.ReconcileEvery, 24*time.Hour)
}

// lastFull is when the last full pass ended: this one, or the one the
// database recorded before it.
func lastFull(r reconcile.Reconciliation) time.Time {
	switch {
	case r.Full:
		return r.At
	case r.Checkpoint.FullAt != nil:
		return *r.Checkpoint.FullAt
	}
	return time.Time{}
}

// recordFirst bounds the findings of each kind a full pass on a standby
// writes on the primary; all are counted. Its log is bounded by logFirst,
// as every run's.
const recordFirst = 100_000

// fullOnStandby runs the scheduled full pass on the standby standby (a
// URL) every RECONCILE_FULL_INTERVAL: at each RECONCILE_INTERVAL it asks
// the primary whether one is due and claims it (one replica at a time),
// reads every transfer on the standby, which only reads, and writes on the
// primary what it found: its findings, which the periodic passes report
// from then on until resolved, and, when the transfers no longer sum to
// the checkpoint, a mark that has the next periodic pass, on the primary,
// make it anew.
func fullOnStandby(ctx context.Context, primary *sqlx.DB, standby string, cfg config.Config, log *slog.Logger) {
	wait := min(cfg.ReconcileEvery, time.Minute)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = cfg.ReconcileEvery
		claimed, err := reconcile.ClaimFull(ctx, primary, cfg.ReconcileFull, fullBound(cfg))
		if err != nil || !claimed {
			if err != nil && ctx.Err() == nil {
				log.Error("reconcile: claim the full pass on the standby", "err", err)
			}
			continue
		}
		run, cancel := context.WithTimeout(ctx, fullBound(cfg))
		rep, err := readStandby(run, standby, cfg)
		if err == nil {
			err = reconcile.RecordFull(run, primary, rep.Reconciliation)
		}
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				log.Error("reconcile: the full pass on the standby failed", "err", err)
			}
			if err := reconcile.ReleaseFull(context.WithoutCancel(ctx), primary); err != nil {
				log.Error("reconcile: release the full pass's claim", "err", err)
			}
			continue
		}
		logReconcile(log.With("on", "standby"), rep)
	}
}

// readStandby is one full pass on the standby.
func readStandby(ctx context.Context, standby string, cfg config.Config) (reconcileReport, error) {
	database, err := db.Open(ctx, standby, 2)
	if err != nil {
		return reconcileReport{}, fmt.Errorf("reconcile: RECONCILE_DATABASE_URL: %w", err)
	}
	defer database.Close()
	return runReconcile(ctx, database, cfg, recordFirst, passFull, 0, false, dlqNone, 0)
}

// logFirst bounds the lines any run logs per kind of finding, whatever it
// holds: the service's periodic pass reads this many of each kind, the
// full pass on a standby up to recordFirst, to write them down on the
// primary. Past it, one line says how many of the kind were left out, and
// the summary line counts them all.
const logFirst = 10

// logFindings logs the first logFirst of items with line, then, when
// count (all the kind's findings) is more, how many were left out.
func logFindings[T any](log *slog.Logger, kind string, items []T, count int, line func(T)) {
	shown := min(len(items), logFirst)
	for _, it := range items[:shown] {
		line(it)
	}
	if count > shown {
		log.Warn("reconcile: findings left out of the log", "kind", kind, "logged", shown, "left_out", count-shown, "count", count)
	}
}

// logReconcile logs the findings of rep, at most logFirst of each kind
// and a line for the rest, then one summary line.
func logReconcile(log *slog.Logger, rep reconcileReport) {
	logFindings(log, "drift", rep.Drift, rep.DriftCount, func(d reconcile.Drift) {
		attrs := []any{"account", d.Account, "expected", d.Expected, "difference", d.Difference}
		if d.Actual != nil {
			attrs = append(attrs, "actual", *d.Actual)
		} else {
			attrs = append(attrs, "actual", "no balance row")
		}
		log.Error("reconcile: balance drift", attrs...)
	})
	logFindings(log, "changed", rep.Changed, rep.ChangedCount, func(c reconcile.Changed) {
		attrs := []any{"account", c.Account, "transfers", c.Transfers, "checkpoint", c.Checkpoint, "difference", c.Difference,
			"checkpoint_made_at", c.CheckpointMadeAt}
		if c.FirstSeen != nil {
			attrs = append(attrs, "first_seen", *c.FirstSeen)
		}
		log.Error("reconcile: transfers changed since the checkpoint", attrs...)
	})
	logFindings(log, "duplicate", rep.Duplicates, rep.DupCount, func(d reconcile.Duplicate) {
		log.Warn("reconcile: suspected duplicate intent", "transfer_id", d.Transfer, "earlier_transfer_id", d.Earlier,
			"from_account", d.From, "to_account", d.To, "amount_minor", d.Amount, "currency", d.Currency,
			"apart_ms", d.CreatedAt.Sub(d.EarlierAt).Milliseconds())
	})
	logFindings(log, "waiting", rep.Waiting, rep.WaitCount, func(w reconcile.Waiting) {
		log.Warn("reconcile: transition waiting for its creation", "transfer_id", w.Transfer, "event_id", w.EventID,
			"event_type", w.EventType, "received_at", w.ReceivedAt, "waited_s", int64(rep.At.Sub(w.ReceivedAt).Seconds()))
	})
	logFindings(log, "old_dead_letter", rep.DeadLetters.Letters, rep.DeadLetters.Old+rep.DeadLetters.Undated, func(l deadLetter) {
		log.Warn("reconcile: dead letter the inbox can no longer prove harmless to replay", "event_id", l.EventID,
			"class", l.Class, "dead_since", l.DeadSince)
	})
	level := slog.LevelInfo
	if rep.findings() > 0 {
		level = slog.LevelWarn
	}
	attrs := []any{"pass", passName(rep.Reconciliation), "transfers", rep.Transfers, "accounts", rep.Accounts,
		"drift", rep.DriftCount, "changed_since_checkpoint", rep.ChangedCount, "duplicate_intents", rep.DupCount,
		"waiting_transitions", rep.WaitCount, "old_dead_letters", oldLetters(rep.DeadLetters), "duration_ms", rep.Duration.Milliseconds()}
	if rep.Checkpoint.Compared {
		attrs = append(attrs, "differ_from_checkpoint", rep.Checkpoint.Differs)
	}
	if why := strings.Join(slices.DeleteFunc([]string{rep.Checkpoint.Broken, rep.Checkpoint.Distrusted},
		func(s string) bool { return s == "" }), "; "); why != "" {
		attrs = append(attrs, "checkpoint_not_trusted", why)
	}
	if !rep.DeadLetters.Read {
		attrs = append(attrs, "dead_letters", rep.DeadLetters.Error) // why old_dead_letters is -1
	}
	log.Log(context.Background(), level, "reconciled", attrs...)
}

// oldLetters is the count of dead letters replay cannot prove harmless, -1
// when the DLQ was not read.
func oldLetters(d deadLetters) int {
	if !d.Read {
		return -1
	}
	return d.Old + d.Undated
}
