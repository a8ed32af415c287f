package db

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// reconcileLock is the advisory lock key that lets one replica at a time
// run the periodic reconciliation.
const reconcileLock = 7_301_004

// ReconcileOptions say what Reconcile looks for.
type ReconcileOptions struct {
	// Window: two creations of one intent (the same accounts, amount and
	// currency) under different transferIds, created at most this far
	// apart, are a suspected duplicate intent.
	Window time.Duration
	// PendingAfter: a transition waiting for its creation longer than this
	// is reported.
	PendingAfter time.Duration
	// Limit: the findings of each kind returned; all are counted.
	Limit int
	// Exclusive takes the reconciliation's advisory lock for the snapshot's
	// transaction and does nothing when another holds it: the service's
	// periodic run, one replica at a time. A person's command need not.
	Exclusive bool
}

// Reconciliation is what one snapshot of the database showed.
type Reconciliation struct {
	Ran       bool      // false when Exclusive found another run holding the lock
	At        time.Time // the snapshot's time, the database's clock
	Transfers int64     // transfer rows read
	Accounts  int64     // balance rows read

	Drift      []Drift // in account order, at most Limit
	DriftCount int
	Duplicates []Duplicate // oldest first, at most Limit
	DupCount   int
	Waiting    []Waiting // oldest first, at most Limit
	WaitCount  int
}

// Drift is an account whose balance is not the net of its transfers.
type Drift struct {
	Account  string `json:"account" db:"account"`
	Expected int64  `json:"expected" db:"expected"`
	// Actual is nil when the account has transfers but no balance row.
	Actual     *int64 `json:"actual" db:"actual"`
	Difference int64  `json:"difference" db:"difference"` // actual (0 without a row) − expected
}

// Duplicate is a creation that repeats an earlier one's intent.
type Duplicate struct {
	From      string    `json:"from_account" db:"from_account"`
	To        string    `json:"to_account" db:"to_account"`
	Amount    int64     `json:"amount_minor" db:"amount_minor"`
	Currency  string    `json:"currency" db:"currency"`
	Transfer  string    `json:"transfer_id" db:"transfer_id"`
	CreatedAt time.Time `json:"created_at" db:"created_at"`
	Earlier   string    `json:"earlier_transfer_id" db:"earlier_transfer_id"`
	EarlierAt time.Time `json:"earlier_created_at" db:"earlier_created_at"`
}

// Waiting is a transition that has waited for its creation too long.
type Waiting struct {
	Transfer   string    `json:"transfer_id" db:"transfer_id"`
	EventID    string    `json:"event_id" db:"event_id"`
	EventType  string    `json:"event_type" db:"event_type"`
	From       string    `json:"from_account" db:"from_account"`
	To         string    `json:"to_account" db:"to_account"`
	Amount     int64     `json:"amount_minor" db:"amount_minor"`
	Currency   string    `json:"currency" db:"currency"`
	ReceivedAt time.Time `json:"received_at" db:"received_at"`
}

// repeatableReadOnly is the reconciliation's transaction: one snapshot for
// every query, so that a balance and the transfers that made it are read
// as of the same commit, whatever the consumers apply meanwhile, and
// nothing written. Its plain SELECTs take no lock that apply_event or
// apply_batch wait on (they wait on advisory locks, row locks and the
// inbox's key, none of which a read takes).
var repeatableReadOnly = &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}

// Reconcile reads the database in one REPEATABLE READ READ ONLY
// transaction and reports every balance that is not the net of its
// transfers, the suspected duplicate intents and the transitions waiting
// too long (adr/0007). It changes nothing. Its errors are the database's,
// classified as everywhere (a lost connection or a timeout is transient);
// it retries nothing.
func Reconcile(ctx context.Context, db *sqlx.DB, o ReconcileOptions) (Reconciliation, error) {
	var r Reconciliation
	tx, err := db.BeginTxx(ctx, repeatableReadOnly)
	if err != nil {
		return r, fmt.Errorf("reconcile: begin: %w", translate(err))
	}
	defer tx.Rollback() // read only: nothing to commit
	if o.Exclusive {
		if err := tx.GetContext(ctx, &r.Ran, `SELECT pg_try_advisory_xact_lock($1)`, reconcileLock); err != nil || !r.Ran {
			return r, translateIn("take the reconcile lock", err)
		}
	}
	r.Ran = true
	// One core of the server, as a consumer's transaction has: a parallel
	// scan would take the consumers' CPU for a pass that has no hurry.
	// JIT compiles for longer than these queries run (BENCHMARKS.md).
	if _, err := tx.ExecContext(ctx, `SET LOCAL max_parallel_workers_per_gather = 0; SET LOCAL jit = off`); err != nil {
		return r, translateIn("settings", err)
	}
	if err := tx.QueryRowxContext(ctx, `SELECT now(), (SELECT count(*) FROM transfer), (SELECT count(*) FROM balance_projection)`).
		Scan(&r.At, &r.Transfers, &r.Accounts); err != nil {
		return r, translateIn("count", err)
	}
	var drift []driftRow
	if err := tx.SelectContext(ctx, &drift, driftQuery, o.Limit); err != nil {
		return r, translateIn("balances", err)
	}
	r.Drift, r.DriftCount = firstOf(drift, o.Limit)
	var dups []duplicateRow
	if err := tx.SelectContext(ctx, &dups, duplicateQuery, o.Limit, interval(o.Window)); err != nil {
		return r, translateIn("duplicate intents", err)
	}
	r.Duplicates, r.DupCount = firstOf(dups, o.Limit)
	var waiting []waitingRow
	if err := tx.SelectContext(ctx, &waiting, waitingQuery, o.Limit, interval(o.PendingAfter)); err != nil {
		return r, translateIn("waiting transitions", err)
	}
	r.Waiting, r.WaitCount = firstOf(waiting, o.Limit)
	return r, nil
}

func translateIn(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("reconcile: %s: %w", what, translate(err))
}

func interval(d time.Duration) string { return fmt.Sprintf("%d microseconds", d.Microseconds()) }

// A row of a finding's query: the finding, and how many the query found
// in all (count(*) OVER ()). The queries return at least one row when
// there is any, whatever the limit, so that the count is known.
type (
	driftRow struct {
		Drift
		Total int `db:"total"`
	}
	duplicateRow struct {
		Duplicate
		Total int `db:"total"`
	}
	waitingRow struct {
		Waiting
		Total int `db:"total"`
	}
)

func (r driftRow) split() (Drift, int)         { return r.Drift, r.Total }
func (r duplicateRow) split() (Duplicate, int) { return r.Duplicate, r.Total }
func (r waitingRow) split() (Waiting, int)     { return r.Waiting, r.Total }

// firstOf returns the first limit findings of rows, and their total.
func firstOf[T any, R interface{ split() (T, int) }](rows []R, limit int) ([]T, int) {
	var out []T
	total := 0
	for i, row := range rows {
		f, n := row.split()
		total = n
		if i < limit {
			out = append(out, f)
		}
	}
	return out, total
}
