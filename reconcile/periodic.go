package reconcile

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jmoiron/sqlx"

	"transferconsumer/db"
)

// sweepAccounts is how many balances a periodic pass compares beyond those
// the transfers since the cut-off moved, in account order, resuming where
// the pass before stopped: a balance changed by hand is found within
// accounts/sweepAccounts passes. 100,000 balances are read in well under a
// second (BENCHMARKS.md, "The periodic pass").
const sweepAccounts = 100_000

// PeriodicOptions say what Periodic looks for, and when it is to
// be a full pass.
type PeriodicOptions struct {
	Options
	// FullEvery: the pass is a full one when the last full pass ended
	// longer ago than this (RECONCILE_FULL_INTERVAL); 0 only when the
	// checkpoint cannot be trusted.
	FullEvery time.Duration
	// Full: a full pass whatever the checkpoint (reconcile --rebuild).
	Full bool
	// Sweep: the balances compared beyond those that moved (0:
	// sweepAccounts).
	Sweep int
}

// repeatableReadWrite is the periodic pass's transaction: one snapshot,
// as the full pass's, which is also the cut-off of the checkpoint it
// writes (pg_current_snapshot() in it is the transaction's snapshot).
var repeatableReadWrite = &sql.TxOptions{Isolation: sql.LevelRepeatableRead}

// The full pass's queries, into the working sets.
var (
	duplicatesInto = `INSERT INTO reconcile_pass_duplicate` + fmt.Sprintf(intentPairsSQL, "transfer", "$1")
	waitingInto    = `INSERT INTO reconcile_pass_waiting
SELECT transfer_id, event_id, event_type, from_account, to_account, amount_minor, currency, received_at
FROM (` + waitingQuery + `) w`
)

// Periodic is the service's periodic pass (adr/0007). It first
// neutralizes the transaction ids of another cluster that a restore or
// logical replication left in the transfers (neutralize), forgetting the
// checkpoint when there were any. When the checkpoint can be trusted, it
// adds to each account's net at the checkpoint's cut-off the transfers
// created or failed since, compares the accounts they moved (and the
// sweep's share of the others, and those found in drift before) with
// their balances, and looks for duplicate intents among the transfers of
// the last window and for waiting transitions; otherwise, or when a full
// pass is due, it is a full pass, which compares the transfers with the
// checkpoint when that means anything and makes it anew. In the same
// transaction it moves the checkpoint's cut-off to its own snapshot and
// writes down what it found: its findings are then every finding not yet
// resolved, whichever pass found it.
//
// It writes, so it needs the primary. Its errors are Full's; a
// serialization failure (someone else wrote the checkpoint meanwhile)
// leaves the checkpoint and the findings as they were (a neutralization
// committed before stays: it holds whatever follows).
func Periodic(ctx context.Context, database *sqlx.DB, o PeriodicOptions) (Reconciliation, error) {
	var r Reconciliation
	// Before the pass's snapshot, in transactions of their own: the
	// snapshot then sees the rows neutralized, and the checkpoint
	// forgotten if any was.
	neutralized, ran, err := neutralize(ctx, database, o.Exclusive)
	if err != nil || !ran {
		return r, err
	}
	tx, err := database.BeginTxx(ctx, repeatableReadWrite)
	if err != nil {
		return r, fmt.Errorf("reconcile: begin: %w", db.Translate(err))
	}
	defer tx.Rollback()
	if r.Ran, err = startPass(ctx, tx, o.Exclusive); err != nil || !r.Ran {
		return r, err
	}
	if r.Checkpoint, err = readCheckpoint(ctx, tx); err != nil {
		return r, err
	}
	r.Checkpoint.Neutralized = neutralized
	if err := tx.GetContext(ctx, &r.At, `SELECT now()`); err != nil {
		return r, translateIn("now", err)
	}
	if _, err := tx.ExecContext(ctx, emptyWork); err != nil {
		return r, translateIn("the working sets", err)
	}
	c := r.Checkpoint
	r.Full = o.Full || !c.trusted() || o.FullEvery > 0 && (c.FullAt == nil || r.At.Sub(*c.FullAt) >= o.FullEvery)
	if r.Full {
		err = rebuild(ctx, tx, o, &r)
	} else {
		err = fromCheckpoint(ctx, tx, o, &r)
	}
	if err != nil {
		return r, err
	}
	if err := readFindings(ctx, tx, o.Limit, "", &r); err != nil {
		return r, err
	}
	if _, err := tx.ExecContext(ctx, emptyWork); err != nil {
		return r, translateIn("the working sets", err)
	}
	if err := tx.Commit(); err != nil {
		return r, fmt.Errorf("reconcile: commit: %w", db.Translate(err))
	}
	r.Recorded = true
	return r, nil
}

// fromCheckpoint is the pass from a trusted checkpoint: it costs the transfers
// committed since its cut-off, the window before them, the sweep's share
// and the waiting transitions, not the history.
func fromCheckpoint(ctx context.Context, tx *sqlx.Tx, o PeriodicOptions, r *Reconciliation) error {
	c := r.Checkpoint
	// The transfers since the cut-off are found by the BRIN indexes, the
	// rest by key. A plan that read the table instead would cost the
	// history, which is what this pass is for not to.
	if _, err := tx.ExecContext(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
		return translateIn("settings", err)
	}
	if _, err := tx.ExecContext(ctx, newSince, c.cutoff, c.cutoffXmin); err != nil {
		return translateIn("the transfers since the cut-off", err)
	}
	if _, err := tx.ExecContext(ctx, deltaSince); err != nil {
		return translateIn("what they moved", err)
	}
	sweep := o.Sweep
	if sweep <= 0 {
		sweep = sweepAccounts
	}
	var end *string
	if err := tx.GetContext(ctx, &end, sweepEnd, c.sweptTo, sweep); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return translateIn("the sweep", err)
	}
	if _, err := tx.ExecContext(ctx, candidates, c.sweptTo, end); err != nil {
		return translateIn("the accounts to compare", err)
	}
	if err := tx.QueryRowxContext(ctx, `SELECT (SELECT count(*) FROM reconcile_pass_new), (SELECT count(*) FROM reconcile_pass_candidate)`).
		Scan(&r.Transfers, &r.Accounts); err != nil {
		return translateIn("count", err)
	}
	for _, step := range []struct {
		what, query string
		args        []any
	}{
		{"balances", periodicDrift, nil},
		{"duplicate intents", recentDuplicates, []any{interval(o.Window)}},
		{"waiting transitions", waitingInto, []any{math.MaxInt32, interval(o.PendingAfter)}},
	} {
		if _, err := tx.ExecContext(ctx, step.query, step.args...); err != nil {
			return translateIn(step.what, err)
		}
	}
	if err := writeFindings(ctx, tx, forgetDuplicatesResolved); err != nil {
		return err
	}
	next := ""
	if end != nil {
		next = *end
	}
	if _, err := tx.ExecContext(ctx, moveCheckpoint, next); err != nil {
		return translateIn("move the checkpoint", err)
	}
	return nil
}

// rebuild is the full pass of the periodic run: it sums every transfer,
// compares the sums with the checkpoint when it means anything here, finds
// every finding, writes down the accounts whose transfers differ from the
// checkpoint as changed findings, which no pass resolves, and makes the
// checkpoint anew at its own snapshot.
func rebuild(ctx context.Context, tx *sqlx.Tx, o PeriodicOptions, r *Reconciliation) error {
	if err := countAll(ctx, tx, r); err != nil {
		return err
	}
	cut, xmin := r.Checkpoint.comparable()
	r.Checkpoint.Compared = cut != nil
	if _, err := tx.ExecContext(ctx, `INSERT INTO reconcile_pass_full
		SELECT kind, account, expected, actual, difference, total FROM (`+fullQuery+`) f`, math.MaxInt32, cut, xmin, true); err != nil {
		return translateIn("balances", err)
	}
	// The accounts that differ from the checkpoint are written down by
	// writeFindings, before the checkpoint is made anew from the transfers as
	// they are: each is then reported until a person resolves it, and
	// the checkpoint made anew does not absorb it.
	if err := tx.GetContext(ctx, &r.Checkpoint.Differs, `SELECT count(*) FROM reconcile_pass_full WHERE kind = 'changed'`); err != nil {
		return translateIn("the checkpoint's comparison", err)
	}
	for _, step := range []struct {
		what, query string
		args        []any
	}{
		{"balances", `INSERT INTO reconcile_pass_drift
			SELECT account, expected, actual, difference FROM reconcile_pass_full WHERE kind = 'drift'`, nil},
		{"duplicate intents", duplicatesInto, []any{interval(o.Window)}},
		{"waiting transitions", waitingInto, []any{math.MaxInt32, interval(o.PendingAfter)}},
	} {
		if _, err := tx.ExecContext(ctx, step.query, step.args...); err != nil {
			return translateIn(step.what, err)
		}
	}
	if err := writeFindings(ctx, tx, forgetDuplicatesNotFound); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, rebuildCheckpoint); err != nil {
		return translateIn("make the checkpoint", err)
	}
	if _, err := tx.ExecContext(ctx, rebuiltHeader); err != nil {
		return translateIn("make the checkpoint", err)
	}
	r.Checkpoint.Rebuilt = true
	return nil
}
