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
	"database/sql"
	"fmt"
	"sort"
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

// Checkpoint is what a pass made of the checkpoint it found.
type Checkpoint struct {
	// Present: there is one, or there was until a pass forgot it
	// (Broken says why).
	Present bool `json:"present"`
	// WrittenAt is when the pass that wrote it ran: its cut-off.
	WrittenAt *time.Time `json:"written_at,omitempty"`
	// Broken says why the checkpoint means nothing in this database (its
	// transaction ids are another history's); Distrusted why it is made
	// anew though comparable. Both empty: the periodic pass starts from
	// it.
	Broken     string `json:"broken,omitempty"`
	Distrusted string `json:"distrusted,omitempty"`
	// Neutralized: the rows of transfer and transfer_failure whose
	// transaction ids this pass found another cluster's and neutralized,
	// before its snapshot; the checkpoint was forgotten then (Broken).
	Neutralized int64 `json:"neutralized,omitempty"`
	// Compared: the full pass compared the transfers with it; Differs:
	// the accounts whose transfers it found no longer summing to it
	// (each kept as a finding of Changed).
	Compared bool `json:"compared"`
	Differs  int  `json:"differs"`
	// Rebuilt: this pass made it anew.
	Rebuilt bool `json:"rebuilt"`
	// RebuiltAt and FullAt: when it was last made anew, and when the last
	// full pass before this one ended, on whichever server it read.
	RebuiltAt *time.Time `json:"rebuilt_at,omitempty"`
	FullAt    *time.Time `json:"last_full_at,omitempty"`

	cutoff     *string // the snapshot, as text
	cutoffXmin *int64
	sweptTo    string
}

// madeAt is when c was made anew last, which names the changed findings
// found against it (changedSubject); when it was written, for one
// without.
func (c Checkpoint) madeAt() *time.Time {
	if c.RebuiltAt != nil {
		return c.RebuiltAt
	}
	return c.WrittenAt
}

// trusted reports whether the periodic pass may start from c.
func (c Checkpoint) trusted() bool { return c.Present && c.Broken == "" && c.Distrusted == "" }

// comparable returns the cut-off and its xmin to compare the transfers
// with, both nil when c means nothing here.
func (c Checkpoint) comparable() (*string, *int64) {
	if !c.Present || c.Broken != "" {
		return nil, nil
	}
	return c.cutoff, c.cutoffXmin
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

// repeatableReadOnly is the full pass's transaction: one snapshot for
// every query, so that a balance and the transfers that made it are read
// as of the same commit, whatever the consumers apply meanwhile, and
// nothing written. Its plain SELECTs take no lock that apply_event or
// apply_batch wait on (they wait on advisory locks, row locks and the
// inbox's key, none of which a read takes).
var repeatableReadOnly = &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}

// Full is the full pass: it reads the database in one REPEATABLE
// READ READ ONLY transaction and reports every balance that is not the net
// of its transfers, every account whose transfers no longer sum to what
// the checkpoint says (with the changed findings earlier passes kept, which
// no person resolved yet), the suspected duplicate intents and the
// transitions waiting too long (adr/0007). It changes nothing, so it runs on a standby
// too. Its errors are the database's, classified as everywhere (a lost
// connection or a timeout is transient); it retries nothing.
func Full(ctx context.Context, database *sqlx.DB, o Options) (Reconciliation, error) {
	r := Reconciliation{Full: true}
	tx, err := database.BeginTxx(ctx, repeatableReadOnly)
	if err != nil {
		return r, fmt.Errorf("reconcile: begin: %w", db.Translate(err))
	}
	defer tx.Rollback() // read only: nothing to commit
	if r.Ran, err = startPass(ctx, tx, o.Exclusive); err != nil || !r.Ran {
		return r, err
	}
	if r.Checkpoint, err = readCheckpoint(ctx, tx); err != nil {
		return r, err
	}
	if err := countAll(ctx, tx, &r); err != nil {
		return r, err
	}
	cut, xmin := r.Checkpoint.comparable()
	r.Checkpoint.Compared = cut != nil
	var rows []fullRow
	if err := tx.SelectContext(ctx, &rows, fullQuery, o.Limit, cut, xmin, false); err != nil {
		return r, translateIn("balances", err)
	}
	f := splitFull(rows, o.Limit)
	r.Drift, r.DriftCount, r.Checkpoint.Differs = f.drift, f.driftCount, f.differs
	// The changed findings kept, and those this comparison found that
	// none kept names: a pass that reads only cannot write them down.
	if err := readFindings(ctx, tx, o.Limit, "changed", &r); err != nil {
		return r, err
	}
	for i := range f.fresh {
		f.fresh[i].CheckpointMadeAt, f.fresh[i].CutoffAt = r.Checkpoint.madeAt(), r.Checkpoint.WrittenAt
	}
	r.Changed = append(r.Changed, f.fresh...)
	sort.SliceStable(r.Changed, func(i, j int) bool { return r.Changed[i].Account < r.Changed[j].Account })
	r.Changed, r.ChangedCount = r.Changed[:min(len(r.Changed), o.Limit)], r.ChangedCount+f.freshCount
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

// countAll reads the snapshot's time and counts the transfer and balance
// rows.
func countAll(ctx context.Context, tx *sqlx.Tx, r *Reconciliation) error {
	err := tx.QueryRowxContext(ctx, `SELECT now(), (SELECT count(*) FROM transfer), (SELECT count(*) FROM balance_projection)`).
		Scan(&r.At, &r.Transfers, &r.Accounts)
	return translateIn("count", err)
}

// readCheckpoint reads the checkpoint and judges it (checkpointQuery).
func readCheckpoint(ctx context.Context, tx *sqlx.Tx) (Checkpoint, error) {
	var row struct {
		Cutoff     *string    `db:"cutoff"`
		Forgotten  *string    `db:"forgotten"`
		WrittenAt  *time.Time `db:"written_at"`
		RebuiltAt  *time.Time `db:"rebuilt_at"`
		FullAt     *time.Time `db:"full_at"`
		SweptTo    string     `db:"swept_to"`
		Xmin       *int64     `db:"cutoff_xmin"`
		Broken     *string    `db:"broken"`
		Distrusted *string    `db:"distrusted"`
	}
	if err := tx.GetContext(ctx, &row, checkpointQuery); err != nil {
		return Checkpoint{}, translateIn("read the checkpoint", err)
	}
	c := Checkpoint{Present: row.Cutoff != nil || row.Forgotten != nil, WrittenAt: row.WrittenAt, RebuiltAt: row.RebuiltAt, FullAt: row.FullAt,
		cutoff: row.Cutoff, cutoffXmin: row.Xmin, sweptTo: row.SweptTo}
	if row.Broken != nil {
		c.Broken = *row.Broken
	}
	if row.Distrusted != nil {
		c.Distrusted = *row.Distrusted
	}
	return c, nil
}

func translateIn(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("reconcile: %s: %w", what, db.Translate(err))
}

func interval(d time.Duration) string { return fmt.Sprintf("%d microseconds", d.Microseconds()) }

// A row of a finding's query: the finding, and how many the query found
// in all (count(*) OVER ()). The queries return at least one row when
// there is any, whatever the limit, so that the count is known.
type (
	duplicateRow struct {
		Duplicate
		Total int `db:"total"`
	}
	waitingRow struct {
		Waiting
		Total int `db:"total"`
	}
	// fullRow is a row of fullQuery: a drift, a changed account or a net.
	fullRow struct {
		Kind       string `db:"kind"`
		Account    string `db:"account"`
		Expected   int64  `db:"expected"`
		Actual     *int64 `db:"actual"`
		Difference int64  `db:"difference"`
		Total      int    `db:"total"`
		Fresh      int    `db:"fresh"`
		Kept       bool   `db:"kept"`
	}
)

func (r duplicateRow) split() (Duplicate, int) { return r.Duplicate, r.Total }
func (r waitingRow) split() (Waiting, int)     { return r.Waiting, r.Total }

// fullFound is what fullQuery's rows say: the first drifts and their
// total; how many accounts differ from the checkpoint, and the first of
// those no changed finding kept names yet (fresh), with their total.
type fullFound struct {
	drift      []Drift
	driftCount int
	differs    int
	fresh      []Changed
	freshCount int
}

// splitFull returns what rows say, at most limit of each kind.
func splitFull(rows []fullRow, limit int) fullFound {
	var f fullFound
	for _, row := range rows {
		switch row.Kind {
		case "drift":
			f.driftCount = row.Total
			if len(f.drift) < limit {
				f.drift = append(f.drift, Drift{Account: row.Account, Expected: row.Expected, Actual: row.Actual, Difference: row.Difference})
			}
		case "changed":
			f.differs, f.freshCount = row.Total, row.Fresh
			if !row.Kept && len(f.fresh) < limit {
				f.fresh = append(f.fresh, Changed{Account: row.Account, Transfers: row.Expected, Checkpoint: row.Actual, Difference: row.Difference})
			}
		}
	}
	sort.Slice(f.drift, func(i, j int) bool { return f.drift[i].Account < f.drift[j].Account })
	sort.Slice(f.fresh, func(i, j int) bool { return f.fresh[i].Account < f.fresh[j].Account })
	return f
}

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
