package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"time"

	"github.com/jmoiron/sqlx"

	"transferconsumer/config"
	"transferconsumer/db"
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
