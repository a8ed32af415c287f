package db

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// pruneLock is the advisory lock key that lets one replica at a time prune.
const pruneLock = 7_301_002

// PruneResult is what one Prune run did.
type PruneResult struct {
	Ran       bool  // false when another replica held the prune lock at the start
	Truncated []int // the ring's slots emptied (adr/0009)
	Waiting   []int // slots due that stayed full: their partition was busy past the lock timeout every time
	Deleted   int64 // rows of the legacy inbox removed
	Batches   int
	Ring      Ring // the ring's size, as read
}

// Retention is how Prune removes what the inbox no longer needs.
type Retention struct {
	TTL         time.Duration // INBOX_TTL
	Batch       int           // legacy rows deleted per statement (PRUNE_BATCH)
	LockTimeout time.Duration // how long a TRUNCATE may wait for its partition, and so hold claims up, per attempt
	Attempts    int           // attempts per slot and run
}

// Prune applies the inbox retention with the service's lock timeout
// (200 ms, three attempts per slot): see Retention.Run.
func Prune(ctx context.Context, db *sqlx.DB, ttl time.Duration, batch int) (PruneResult, error) {
	return Retention{TTL: ttl, Batch: batch, LockTimeout: 200 * time.Millisecond, Attempts: 3}.Run(ctx, db)
}

// Run empties, by TRUNCATE, each slot of the inbox ring whose every row is
// older than the TTL and whose turn has not come again (adr/0009), then
// deletes rows older than the TTL from the legacy inbox while it exists
// (the table of the layout before the ring, sql/0011), as retention did
// before: at most Batch rows per statement, each statement its own short
// transaction, FOR UPDATE SKIP LOCKED, until a batch comes back short.
//
// A TRUNCATE needs its partition alone, so it waits for the claims in
// flight (each holds every slot for its transaction's few milliseconds)
// and the claims that come meanwhile wait behind it: it gives up after
// LockTimeout and tries again, at most Attempts times; a slot still busy is
// in Waiting and tried at the next run (its turn lasts a slot's width).
// Claims stay exact throughout: a claim's lookup of every slot waits for
// the TRUNCATE's commit, and the slot held only rows older than the TTL.
//
// Every step first takes the prune advisory lock for its own transaction,
// so replicas pruning on the same interval take turns: a run that finds the
// lock held on its first step does nothing, and one that finds it held
// later stops, leaving the rest to the replica that holds it. The lock is
// transaction-scoped, never a session's: the transaction's end releases it
// wherever it ran, behind PgBouncer in transaction mode too. It returns what
// it did so far along with any error; transient errors are classified as
// usual.
func (r Retention) Run(ctx context.Context, db *sqlx.DB) (PruneResult, error) {
	var res PruneResult
	cutoff := fmt.Sprintf("%d milliseconds", r.TTL.Milliseconds())
	ring, err := ReadRing(ctx, db)
	if err != nil {
		return res, fmt.Errorf("prune: %w", err)
	}
	res.Ring = ring
	var due []dueSlot
	if err := db.SelectContext(ctx, &due, dueSQL, cutoff); err != nil {
		return res, fmt.Errorf("prune: list the slots due: %w", translate(err))
	}
	for _, s := range due {
		emptied := false
		for attempt := 1; ; attempt++ {
			ran, ok, err := truncateSlot(ctx, db, s, r.LockTimeout)
			if err == nil && !ran {
				return res, nil // another replica prunes
			}
			res.Ran = true
			if err == nil {
				emptied = ok
				break
			}
			if !lockTimedOut(err) {
				return res, fmt.Errorf("prune: empty slot %d: %w", s.Slot, translate(err))
			}
			if attempt >= r.Attempts {
				res.Waiting = append(res.Waiting, s.Slot)
				break
			}
			// Let the claims that queued behind the attempt run.
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-time.After(r.LockTimeout):
			}
		}
		if emptied {
			res.Truncated = append(res.Truncated, s.Slot)
		}
	}
	var legacy bool
	if err := db.GetContext(ctx, &legacy, `SELECT to_regclass('processed_event_legacy') IS NOT NULL`); err != nil {
		return res, fmt.Errorf("prune: %w", translate(err))
	}
	if !legacy {
		res.Ran = true
		return res, nil
	}
	return r.deleteLegacy(ctx, db, res, cutoff)
}

// deleteLegacy deletes the legacy inbox's rows older than cutoff, batch by
// batch.
func (r Retention) deleteLegacy(ctx context.Context, db *sqlx.DB, res PruneResult, cutoff string) (PruneResult, error) {
	for {
		var locked bool
		var n int64
		err := inTx(ctx, db, func(tx *sqlx.Tx) error {
			if err := tx.GetContext(ctx, &locked, `SELECT pg_try_advisory_xact_lock($1)`, pruneLock); err != nil || !locked {
				return err
			}
			// The subquery walks the processed_at index oldest first; SKIP
			// LOCKED steps over any row a concurrent transaction holds.
			r, err := tx.ExecContext(ctx, `
				DELETE FROM processed_event_legacy WHERE event_id IN (
					SELECT event_id FROM processed_event_legacy
					WHERE processed_at < now() - $1::interval
					ORDER BY processed_at
					LIMIT $2
					FOR UPDATE SKIP LOCKED)`, cutoff, r.Batch)
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
		if n < int64(r.Batch) {
			return res, nil
		}
		if err := ctx.Err(); err != nil {
			return res, err
		}
	}
}

// lockTimedOut reports whether err is lock_timeout ending a wait (55P03).
func lockTimedOut(err error) bool {
	var pqErr *pq.Error
	return errors.As(err, &pqErr) && pqErr.Code == "55P03"
}

// OldestInboxAge returns the age of the oldest inbox row, 0 when the inbox
// is empty. Retention keeps it under the TTL plus a slot's width. The ring
// has no index by age, so each slot is read in its first pages only, where
// the rows written since its last TRUNCATE begin (a heap fills from its
// start): a few pages per slot, whatever the inbox's size. The legacy
// inbox, while it exists, is read through its processed_at index.
func OldestInboxAge(ctx context.Context, db *sqlx.DB) (time.Duration, error) {
	var parts []string
	if err := db.SelectContext(ctx, &parts, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = to_regclass('processed_event') ORDER BY 1`); err != nil {
		return 0, translate(err)
	}
	var legacy bool
	if err := db.GetContext(ctx, &legacy, `SELECT to_regclass('processed_event_legacy') IS NOT NULL`); err != nil {
		return 0, translate(err)
	}
	var reads []string
	for _, p := range parts {
		reads = append(reads, `SELECT min(processed_at) AS at FROM `+pq.QuoteIdentifier(p)+` WHERE ctid < '(4,0)'`)
	}
	if legacy {
		reads = append(reads, `SELECT min(processed_at) FROM processed_event_legacy`)
	}
	if len(reads) == 0 {
		return 0, nil
	}
	var age sql.NullFloat64
	err := db.GetContext(ctx, &age,
		`SELECT extract(epoch FROM now() - min(at)) FROM (`+strings.Join(reads, " UNION ALL ")+`) r`)
	if err != nil {
		return 0, translate(err)
	}
	if !age.Valid {
		return 0, nil
	}
	return time.Duration(age.Float64 * float64(time.Second)), nil
}

// DropLegacyInbox drops the legacy inbox (sql/0011) once its newest row is
// older than ttl: from then on no claim can find an id there that the TTL
// still protects. It needs the table's owner: the owner's `migrate` runs
// it. It waits at most lockTimeout for the table (the claims in flight hold
// it, and new claims queue behind the wait); a table still busy is left
// for the next run, reported as not dropped. It returns whether the table
// was dropped, and false with no error when there is none or it is young.
func DropLegacyInbox(ctx context.Context, db *sqlx.DB, ttl time.Duration, lockTimeout time.Duration) (bool, error) {
	dropped := false
	err := inTx(ctx, db, func(tx *sqlx.Tx) error {
		var exists bool
		if err := tx.GetContext(ctx, &exists, `SELECT to_regclass('processed_event_legacy') IS NOT NULL`); err != nil || !exists {
			return err
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, lockTimeout.Milliseconds())); err != nil {
			return err
		}
		// No claim adds to it since sql/0011 (they insert into the ring);
		// the lock keeps their lookups out until the drop commits.
		if _, err := tx.ExecContext(ctx, `LOCK TABLE processed_event_legacy IN ACCESS EXCLUSIVE MODE`); err != nil {
			return err
		}
		var young bool
		if err := tx.GetContext(ctx, &young, `SELECT EXISTS (SELECT 1 FROM processed_event_legacy WHERE processed_at >= now() - $1::interval)`,
			fmt.Sprintf("%d milliseconds", ttl.Milliseconds())); err != nil || young {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DROP TABLE processed_event_legacy`); err != nil {
			return err
		}
		dropped = true
		return nil
	})
	if lockTimedOut(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("drop the legacy inbox: %w", translate(err))
	}
	return dropped, nil
}
