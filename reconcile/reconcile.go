// Package reconcile proves the balances from the transfers, and reports
// what the inbox cannot see (adr/0007): balances in drift, transfers
// changed by hand since the checkpoint, suspected duplicate intents and
// transitions waiting for their creation. It owns the reconciliation's SQL
// and tables (sql/0016 on), its advisory lock and its passes: Full, the
// read-only pass over every transfer, which runs on a standby too;
// Periodic, the service's pass from the checkpoint, which writes what it
// found; and ClaimFull, RecordFull and ReleaseFull, the scheduled full
// pass read on a standby and written down on the primary. It sends its
// statements on a pool db opened, and db translates their errors
// (db.Translate): a lost connection or a timeout is transient, and a pass
// retries nothing.
package reconcile

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"transferconsumer/db"
)

// reconcileLock is the advisory lock key that lets one replica at a time
// run the periodic reconciliation, and write what it found. Its own key:
// inbox_maintain takes 7301004, migrate, prune and the transfers' locks
// 7301001 to 7301003 (a pass sharing maintain's key made each wait on the
// other, and a periodic pass skip its turn).
const reconcileLock = 7_301_005

// Options say what a pass looks for.
type Options struct {
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
	Ran bool // false when Exclusive found another run holding the lock
	// Full: every transfer was summed. Otherwise the periodic pass added
	// the transfers since the checkpoint's cut-off (adr/0007).
	Full bool
	// Recorded: the pass wrote the checkpoint and its findings, which are
	// then every finding not yet resolved, whichever pass found it.
	Recorded bool
	At       time.Time // the snapshot's time, the database's clock
	// Full pass: the transfer and balance rows read. Periodic pass: the
	// transfers created or failed since the cut-off, and the accounts
	// compared.
	Transfers int64
	Accounts  int64

	Checkpoint Checkpoint

	Drift      []Drift // in account order, at most Limit
	DriftCount int
	Duplicates []Duplicate // oldest first, at most Limit
	DupCount   int
	Waiting    []Waiting // oldest first, at most Limit
	WaitCount  int
	// The accounts whose transfers a full pass found no longer summing to
	// what a checkpoint and the transfers since its cut-off said (a
	// transfer it counted was changed or deleted by hand), each until a
	// person resolves it (reconcile_resolved): a recorded pass reports
	// every one kept in reconcile_finding, whichever pass found it; the
	// read-only full pass, those kept and those its own comparison finds
	// that none kept names yet. No pass resolves one (adr/0007).
	Changed      []Changed // in account order, at most Limit
	ChangedCount int
	// Recorded: when the oldest finding still reported was first seen,
	// nil when there is none.
	OldestFinding *time.Time
}

// LastFull is when the last full pass ended: r, or the one the database
// recorded before it; zero before the first.
func (r Reconciliation) LastFull() time.Time {
	switch {
	case r.Full:
		return r.At
	case r.Checkpoint.FullAt != nil:
		return *r.Checkpoint.FullAt
	}
	return time.Time{}
}

// Drift is an account whose balance is not the net of its transfers.
type Drift struct {
	Account  string `json:"account" db:"account"`
	Expected int64  `json:"expected" db:"expected"`
	// Actual is nil when the account has transfers but no balance row.
	Actual     *int64     `json:"actual" db:"actual"`
	Difference int64      `json:"difference" db:"difference"` // actual (0 without a row) − expected
	FirstSeen  *time.Time `json:"first_seen,omitempty" db:"-"`
}

// Duplicate is a creation that repeats an earlier one's intent.
type Duplicate struct {
	From      string     `json:"from_account" db:"from_account"`
	To        string     `json:"to_account" db:"to_account"`
	Amount    int64      `json:"amount_minor" db:"amount_minor"`
	Currency  string     `json:"currency" db:"currency"`
	Transfer  string     `json:"transfer_id" db:"transfer_id"`
	CreatedAt time.Time  `json:"created_at" db:"created_at"`
	Earlier   string     `json:"earlier_transfer_id" db:"earlier_transfer_id"`
	EarlierAt time.Time  `json:"earlier_created_at" db:"earlier_created_at"`
	FirstSeen *time.Time `json:"first_seen,omitempty" db:"-"`
}

// Waiting is a transition that has waited for its creation too long.
type Waiting struct {
	Transfer   string     `json:"transfer_id" db:"transfer_id"`
	EventID    string     `json:"event_id" db:"event_id"`
	EventType  string     `json:"event_type" db:"event_type"`
	From       string     `json:"from_account" db:"from_account"`
	To         string     `json:"to_account" db:"to_account"`
	Amount     int64      `json:"amount_minor" db:"amount_minor"`
	Currency   string     `json:"currency" db:"currency"`
	ReceivedAt time.Time  `json:"received_at" db:"received_at"`
	FirstSeen  *time.Time `json:"first_seen,omitempty" db:"-"`
}

// Changed is an account whose transfers no longer summed to what the
// checkpoint and the transfers since its cut-off said when a full pass
// compared them: a transfer the checkpoint counted was changed or deleted
// behind the service's back. It is kept as it was found, the figures of
// that comparison, until a person resolves it.
type Changed struct {
	Account   string `json:"account"`
	Transfers int64  `json:"transfers"` // the net of its transfers then
	// Checkpoint is what the checkpoint and the transfers since said, nil
	// when neither knew the account.
	Checkpoint *int64 `json:"checkpoint"`
	Difference int64  `json:"difference"` // Checkpoint (0 when nil) − Transfers
	// CheckpointMadeAt is when the checkpoint compared was made (its
	// rebuilt_at), which names the finding with the account; CutoffAt,
	// the cut-off it was compared at: the transfer changed is one created
	// before it.
	CheckpointMadeAt *time.Time `json:"checkpoint_made_at,omitempty"`
	CutoffAt         *time.Time `json:"cutoff_at,omitempty"`
	FirstSeen        *time.Time `json:"first_seen,omitempty"`
}

// startPass takes the reconciliation's lock when exclusive, reporting whether
// the pass may run, and sets the pass's transaction to one server core
// without JIT: a parallel scan would take the consumers' CPU for a pass
// that has no hurry, and JIT compiles for longer than these queries run
// (BENCHMARKS.md).
func startPass(ctx context.Context, tx *sqlx.Tx, exclusive bool) (bool, error) {
	if exclusive {
		var got bool
		if err := tx.GetContext(ctx, &got, `SELECT pg_try_advisory_xact_lock($1)`, reconcileLock); err != nil || !got {
			return false, translateIn("take the reconcile lock", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `SET LOCAL max_parallel_workers_per_gather = 0; SET LOCAL jit = off`); err != nil {
		return false, translateIn("settings", err)
	}
	return true, nil
}

func translateIn(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("reconcile: %s: %w", what, db.Translate(err))
}

func interval(d time.Duration) string { return fmt.Sprintf("%d microseconds", d.Microseconds()) }
