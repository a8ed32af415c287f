package reconcile

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"

	"transferconsumer/db"
)

// Transaction ids of another cluster (adr/0007, "Another cluster's
// transaction ids"). The periodic pass tells the transfers since its
// cut-off by their transactions' ids (created_xid, failed_xid), which
// mean something only in the cluster that gave them. A dump restored
// into a cluster made anew, or logical replication into one, keeps the
// old cluster's: usually far above the new cluster's counter, so that
// every pass would count them as committed since its cut-off, again and
// again. Each pass that writes first neutralizes them.
//
// A row a statement sees was made by a transaction its snapshot sees, so
// in this cluster a visible row's id is visible in the statement's own
// snapshot (pg_current_snapshot(), in READ COMMITTED the statement's).
// A visible row whose id is not can only have been copied from another
// cluster. An insert of this cluster still in flight is not visible to the
// statement, so it is never neutralized; a row another transaction updates
// meanwhile is checked again, as it is then, by READ COMMITTED before it
// is written. A copied id already visible by number stays visible in
// every later snapshot (the transaction of this cluster with that number
// has ended, or never will begin), so it is counted in every checkpoint
// made from now on, as a row of this cluster would be, and is left alone.

// neutralizeBatch is how many rows of each table one transaction of the
// neutralization rewrites: a restore's rows are neutralized by the first
// pass after it, in transactions of this size, each holding its rows'
// locks only until it commits.
const neutralizeBatch = 10_000

// foreignSQL is true for an id (the bigint column %[1]s) that the current
// snapshot does not see, and that so cannot be this cluster's on a visible
// row. Its first term is what the BRIN indexes find: only the page ranges
// written since the snapshot's xmin, in steady state the last.
const foreignSQL = `(%[1]s >= pg_snapshot_xmin(pg_current_snapshot())::text::bigint
    AND NOT pg_visible_in_snapshot(%[1]s::text::xid8, pg_current_snapshot()))`

// neutralizeTransfers sets the created_xid of up to $1 transfers whose id
// is another cluster's to NULL, which puts them in every checkpoint, as
// the transfers made before sql/0016. The batch's keys are found first
// (by the BRIN index), then its rows by key: a join would read every
// range of the restored history for each batch.
var neutralizeTransfers = `
UPDATE transfer t SET created_xid = NULL
WHERE t.transfer_id = ANY (ARRAY(SELECT transfer_id FROM transfer WHERE ` + fmt.Sprintf(foreignSQL, "created_xid") + ` LIMIT $1))
  AND ` + fmt.Sprintf(foreignSQL, "t.created_xid")

// neutralizeFailures does the same for up to $1 rows of transfer_failure:
// a failed_xid of another cluster becomes 0, below any cut-off's xmin (the
// failure is in every checkpoint), a created_xid NULL. A created_xid of
// another cluster beside a failed_xid of this one (a failure applied here
// before the pass neutralized its transfer) matters only while the next
// pass reads the failure, so it is looked for among the failures since the
// checkpoint's cut-off, which are found by the BRIN index on failed_xid.
var neutralizeFailures = `
WITH since AS (
    SELECT least(coalesce((SELECT pg_snapshot_xmin(cutoff)::text::bigint FROM reconcile_checkpoint),
                          pg_snapshot_xmin(pg_current_snapshot())::text::bigint),
                 pg_snapshot_xmin(pg_current_snapshot())::text::bigint) AS xmin
)
UPDATE transfer_failure f SET
    failed_xid = CASE WHEN ` + fmt.Sprintf(foreignSQL, "f.failed_xid") + ` THEN 0 ELSE f.failed_xid END,
    created_xid = CASE WHEN ` + fmt.Sprintf(foreignSQL, "f.created_xid") + ` THEN NULL ELSE f.created_xid END
WHERE f.ctid = ANY (ARRAY(
        SELECT ctid FROM transfer_failure
        WHERE failed_xid >= (SELECT xmin FROM since)
          AND (` + fmt.Sprintf(foreignSQL, "failed_xid") + ` OR ` + fmt.Sprintf(foreignSQL, "created_xid") + `)
        LIMIT $1))
  AND (` + fmt.Sprintf(foreignSQL, "f.failed_xid") + ` OR ` + fmt.Sprintf(foreignSQL, "f.created_xid") + `)`

// forgetCheckpoint sets the checkpoint's cut-off to NULL, saying why ($1):
// it no longer says which of the rows neutralized it counted, so the next
// pass is a full one, which makes it anew without comparing the transfers
// with it (there is nothing left to compare with).
const forgetCheckpoint = `UPDATE reconcile_checkpoint SET cutoff = NULL, forgotten = $1`

// neutralize neutralizes the transaction ids of another cluster in
// transfer and transfer_failure, in READ COMMITTED transactions of
// neutralizeBatch rows of each, until none is left, and forgets the
// checkpoint in each transaction that neutralized any. With exclusive,
// each takes the reconciliation's lock, as every write to its tables
// does, and it reports false, having done nothing more, when another pass
// holds it. It returns how many rows it neutralized. In steady state it is
// one transaction that finds none, reading the BRIN indexes and the page
// ranges written since the cut-off.
func neutralize(ctx context.Context, database *sqlx.DB, exclusive bool) (int64, bool, error) {
	var transfers, failures int64
	for {
		t, f, ran, err := neutralizeOnce(ctx, database, exclusive, transfers, failures)
		if err != nil || !ran {
			return transfers + failures, ran, err
		}
		transfers, failures = transfers+t, failures+f
		if t < neutralizeBatch && f < neutralizeBatch {
			return transfers + failures, true, nil
		}
	}
}

// neutralizeOnce is one transaction of neutralize; transfers and failures
// are the rows the transactions before it in the pass neutralized.
func neutralizeOnce(ctx context.Context, database *sqlx.DB, exclusive bool, transfers, failures int64) (t, f int64, ran bool, err error) {
	tx, err := database.BeginTxx(ctx, nil)
	if err != nil {
		return 0, 0, false, fmt.Errorf("reconcile: begin: %w", db.Translate(err))
	}
	defer tx.Rollback()
	if ran, err = startPass(ctx, tx, exclusive); err != nil || !ran {
		return 0, 0, ran, err
	}
	// Found by the BRIN indexes, as the pass's own transfers since the
	// cut-off: a plan that read the table would cost the history.
	if _, err := tx.ExecContext(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
		return 0, 0, false, translateIn("settings", err)
	}
	for _, step := range []struct {
		query string
		n     *int64
	}{{neutralizeTransfers, &t}, {neutralizeFailures, &f}} {
		res, err := tx.ExecContext(ctx, step.query, neutralizeBatch)
		if err != nil {
			return 0, 0, false, translateIn("neutralize another cluster's transaction ids", err)
		}
		if *step.n, err = res.RowsAffected(); err != nil {
			return 0, 0, false, translateIn("neutralize another cluster's transaction ids", err)
		}
	}
	if t+f > 0 {
		why := fmt.Sprintf("transaction ids of another cluster (a dump restored into this one, or logical replication) were on %d transfer(s) "+
			"and %d failure(s), and were neutralized: the cut-off no longer says which of those it counted; the schema's owner should "+
			"rebuild the BRIN indexes transfer_created_range and transfer_failure_range after a VACUUM (adr/0007, \"After a restore\")",
			transfers+t, failures+f)
		if _, err := tx.ExecContext(ctx, forgetCheckpoint, why); err != nil {
			return 0, 0, false, translateIn("forget the checkpoint", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, 0, false, fmt.Errorf("reconcile: commit: %w", db.Translate(err))
	}
	return t, f, true, nil
}
