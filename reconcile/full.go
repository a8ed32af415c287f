package reconcile

import (
	"context"
	"database/sql"
	"fmt"
	"sort"

	"github.com/jmoiron/sqlx"

	"transferconsumer/db"
)

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

// countAll reads the snapshot's time and counts the transfer and balance
// rows.
func countAll(ctx context.Context, tx *sqlx.Tx, r *Reconciliation) error {
	err := tx.QueryRowxContext(ctx, `SELECT now(), (SELECT count(*) FROM transfer), (SELECT count(*) FROM balance_projection)`).
		Scan(&r.At, &r.Transfers, &r.Accounts)
	return translateIn("count", err)
}

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
