package db

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// pruneLock is the advisory lock key that lets one replica at a time prune.
const pruneLock = 7_301_002

// PruneResult is what one Prune run did.
type PruneResult struct {
	Ran     bool  // false when another replica held the prune lock at the start
	Deleted int64 // inbox rows removed
	Batches int
}

// Prune deletes inbox rows older than ttl, at most batch rows per statement,
// until none are left, each batch in its own short transaction so that it
// holds row locks only on the rows it removes and never blocks a consumer's
// claim. Each batch first takes the prune advisory lock for its own
// transaction, so replicas pruning on the same interval take turns instead
// of competing: a run that finds the lock held on its first batch does
// nothing, and one that finds it held later stops, leaving the rest to the
// replica that holds it. The lock is transaction-scoped, never a session's:
// the transaction's end releases it wherever it ran, behind PgBouncer in
// transaction mode too, and a lost connection cannot leave it behind. It
// returns the rows deleted so far along with any error; transient errors
// are classified as usual.
func Prune(ctx context.Context, db *sqlx.DB, ttl time.Duration, batch int) (PruneResult, error) {
	var res PruneResult
	cutoff := fmt.Sprintf("%d milliseconds", ttl.Milliseconds())
	for {
		var locked bool
		var n int64
		err := inTx(ctx, db, func(tx *sqlx.Tx) error {
			if err := tx.GetContext(ctx, &locked, `SELECT pg_try_advisory_xact_lock($1)`, pruneLock); err != nil || !locked {
				return err
			}
			// The subquery walks the processed_at index oldest first; SKIP
			// LOCKED steps over any row a concurrent transaction holds. It
			// leaves the rows of the day partitions that inbox_maintain
			// drops whole (adr/0011): ids minted from two days before the
			// TTL's edge to the last day made. A day the owner's
			// maintenance has not dropped two days after its time is
			// emptied row by row, as the other partitions are.
			r, err := tx.ExecContext(ctx, `
				DELETE FROM processed_event WHERE event_id IN (
					SELECT event_id FROM processed_event
					WHERE processed_at < now() - $1::interval
					  AND (event_id < (SELECT inbox_bound(now() - $1::interval - interval '2 days'))
					       OR event_id >= (SELECT inbox_day_bound((now() AT TIME ZONE 'UTC')::date + 1 + coalesce(inbox_days_ahead(), 0))))
					ORDER BY processed_at
					LIMIT $2
					FOR UPDATE SKIP LOCKED)`, cutoff, batch)
			if err != nil {
				return err
			}
			n, _ = r.RowsAffected()
			return nil
		})
		if err != nil {
			return res, fmt.Errorf("prune: delete batch %d: %w", res.Batches+1, translate(err))
		}
		if !locked {
			return res, nil
		}
		res.Ran = true
		res.Deleted += n
		res.Batches++
		if n < int64(batch) {
			return res, nil
		}
		if err := ctx.Err(); err != nil {
			return res, err
		}
	}
}

// OldestInboxAge returns the age of the oldest inbox row, 0 when the inbox is
// empty. Retention keeps it under the TTL plus one prune interval.
func OldestInboxAge(ctx context.Context, db *sqlx.DB) (time.Duration, error) {
	var age sql.NullFloat64
	err := db.GetContext(ctx, &age,
		`SELECT extract(epoch FROM now() - min(processed_at)) FROM processed_event`)
	if err != nil {
		return 0, translate(err)
	}
	if !age.Valid {
		return 0, nil
	}
	return time.Duration(age.Float64 * float64(time.Second)), nil
}
