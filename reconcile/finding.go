package reconcile

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"transferconsumer/db"
)

// What the passes found, kept in reconcile_finding until a pass finds it
// resolved, or, a changed finding, until a person does (adr/0007,
// "Nothing found is lost between passes").

// writeFindingsSQL writes a pass's findings (the working sets
// reconcile_pass_drift, _duplicate, _waiting and the changed rows of
// _full) into reconcile_finding, keeping when each was first seen, and
// deletes those the pass found resolved:
//   - a drift, when its account was compared and is not in drift: every
//     pass compares each account found in drift before;
//   - a waiting transition, when it is no longer waiting: every pass
//     reads all of pending_transition;
//   - a duplicate intent, when a full pass did not find it, or (the
//     periodic pass, which reads only the last window) when one of its two
//     transfers failed or is gone, or a person dismissed it (%s: the
//     pass's forgetDuplicates).
//
// A changed finding is never deleted: once the checkpoint is made anew
// from the transfers as they are, no pass can find the change again, and
// it is the one finding that says someone edited history. It is written
// as found, before the checkpoint it differs from is made anew (its
// subject names that checkpoint, changedSubject), and found again only
// while that checkpoint stands (a standby's full pass, then the primary's
// that makes it anew): then only last_seen moves.
var writeFindingsSQL = `
DELETE FROM reconcile_finding f WHERE f.kind = 'drift'
    AND NOT EXISTS (SELECT 1 FROM reconcile_pass_drift d WHERE d.account = f.subject);
DELETE FROM reconcile_finding f WHERE f.kind = 'waiting'
    AND NOT EXISTS (SELECT 1 FROM reconcile_pass_waiting w WHERE w.transfer_id::text = f.subject);
%s;
INSERT INTO reconcile_finding AS f (kind, subject, detail)
SELECT 'drift', account, to_jsonb(d) FROM reconcile_pass_drift d
UNION ALL
SELECT 'duplicate', transfer_id::text, to_jsonb(d) - 'total' FROM reconcile_pass_duplicate d
UNION ALL
SELECT 'waiting', transfer_id::text, to_jsonb(w) - 'total' FROM reconcile_pass_waiting w
ON CONFLICT (kind, subject) DO UPDATE SET detail = EXCLUDED.detail, last_seen = EXCLUDED.last_seen;
INSERT INTO reconcile_finding AS f (kind, subject, detail)
SELECT 'changed', ` + fmt.Sprintf(changedSubject, "p.account", "c.rebuilt_at", "c.written_at") + `,
       jsonb_build_object('account', p.account, 'transfers', p.expected, 'checkpoint', p.actual, 'difference', p.difference,
                          'checkpoint_made_at', coalesce(c.rebuilt_at, c.written_at), 'cutoff_at', c.written_at)
FROM reconcile_pass_full p, reconcile_checkpoint c
WHERE p.kind = 'changed'
ON CONFLICT (kind, subject) DO UPDATE SET last_seen = EXCLUDED.last_seen`

// The duplicate intents a pass forgets: the full pass, those it did not
// find; the periodic pass, which reads only the last window, those found
// resolved since (one of the two transfers failed or is gone, or a person
// dismissed the pair).
const (
	forgetDuplicatesNotFound = `DELETE FROM reconcile_finding f WHERE f.kind = 'duplicate'
    AND NOT EXISTS (SELECT 1 FROM reconcile_pass_duplicate d WHERE d.transfer_id::text = f.subject)`
	forgetDuplicatesResolved = `DELETE FROM reconcile_finding f WHERE f.kind = 'duplicate'
    AND NOT EXISTS (SELECT 1 FROM transfer l JOIN transfer e ON e.transfer_id = (f.detail->>'earlier_transfer_id')::uuid
                    WHERE l.transfer_id = f.subject::uuid AND l.state <> 'failed' AND e.state <> 'failed'
                      AND NOT EXISTS (SELECT 1 FROM reconcile_dismissed x WHERE x.transfer_id = l.transfer_id))`
)

// writeFindings writes down the findings of a pass (writeFindingsSQL),
// forgetting the duplicate intents forgetDuplicates deletes.
func writeFindings(ctx context.Context, tx *sqlx.Tx, forgetDuplicates string) error {
	if _, err := tx.ExecContext(ctx, fmt.Sprintf(writeFindingsSQL, forgetDuplicates)); err != nil {
		return translateIn("write the findings", err)
	}
	return nil
}

// unresolved is true for a finding f no person resolved: only a changed
// finding is resolved so (sql/0020); the others go when a pass finds them
// resolved.
const unresolved = `NOT EXISTS (SELECT 1 FROM reconcile_resolved r WHERE r.kind = f.kind AND r.subject = f.subject)`

// findingsQuery reads the first $1 findings of each kind (at least one,
// for the count), or of the kind $2 only, in the order a pass reports
// them, with their totals. Each detail carries when it was first seen,
// under the key its type reads it by (first_seen).
const findingsQuery = `
SELECT kind, detail || jsonb_build_object('first_seen', first_seen) AS detail, total FROM (
    SELECT kind, detail, first_seen, count(*) OVER (PARTITION BY kind) AS total,
           row_number() OVER (PARTITION BY kind ORDER BY
               CASE kind WHEN 'duplicate' THEN (detail->>'created_at')::timestamptz
                         WHEN 'waiting' THEN (detail->>'received_at')::timestamptz END, subject) AS n
    FROM reconcile_finding f
    WHERE ` + unresolved + ` AND ($2::text IS NULL OR kind = $2)) f
WHERE n <= greatest($1::int, 1)
ORDER BY kind, n`

// findingRow is a row of findingsQuery.
type findingRow struct {
	Kind   string `db:"kind"`
	Detail []byte `db:"detail"`
	Total  int    `db:"total"`
}

// readFindings sets r's findings to those recorded and not resolved, the
// first limit of each kind; with only, of that kind alone (the others
// are left as they are).
func readFindings(ctx context.Context, tx *sqlx.Tx, limit int, only string, r *Reconciliation) error {
	var rows []findingRow
	var kind *string
	if only != "" {
		kind = &only
	}
	if err := tx.SelectContext(ctx, &rows, findingsQuery, limit, kind); err != nil {
		return translateIn("read the findings", err)
	}
	if only == "" {
		r.Drift, r.Duplicates, r.Waiting = nil, nil, nil
		r.DriftCount, r.DupCount, r.WaitCount = 0, 0, 0
		if err := tx.GetContext(ctx, &r.OldestFinding, `SELECT min(first_seen) FROM reconcile_finding f WHERE `+unresolved); err != nil {
			return translateIn("read the findings", err)
		}
	}
	r.Changed, r.ChangedCount = nil, 0
	for _, row := range rows {
		var err error
		switch row.Kind {
		case "drift":
			err = keepFinding(&r.Drift, &r.DriftCount, row, limit)
		case "duplicate":
			err = keepFinding(&r.Duplicates, &r.DupCount, row, limit)
		case "waiting":
			err = keepFinding(&r.Waiting, &r.WaitCount, row, limit)
		case "changed":
			err = keepFinding(&r.Changed, &r.ChangedCount, row, limit)
		}
		if err != nil {
			return fmt.Errorf("reconcile: read a %s finding: %w", row.Kind, err)
		}
	}
	return nil
}

// keepFinding counts row's kind (count, its total) and appends its finding
// to list while list holds fewer than limit.
func keepFinding[T any](list *[]T, count *int, row findingRow, limit int) error {
	*count = row.Total
	if len(*list) >= limit {
		return nil
	}
	var f T
	if err := json.Unmarshal(row.Detail, &f); err != nil {
		return err
	}
	*list = append(*list, f)
	return nil
}

// ClaimFull claims the scheduled full pass for this replica to run on a
// standby (RECONCILE_DATABASE_URL): it reports true when the last full
// pass ended longer ago than every and no other replica's claim is
// current, and claims it for bound. It writes on primary, under the
// reconciliation's lock (false while another pass holds it).
func ClaimFull(ctx context.Context, primary *sqlx.DB, every, bound time.Duration) (bool, error) {
	tx, err := primary.BeginTxx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("reconcile: begin: %w", db.Translate(err))
	}
	defer tx.Rollback()
	if ok, err := startPass(ctx, tx, true); err != nil || !ok {
		return false, err
	}
	var claimed []bool
	if err := tx.SelectContext(ctx, &claimed, `UPDATE reconcile_checkpoint SET full_claimed_until = now() + $2::interval
		WHERE coalesce(full_claimed_until, '-infinity') < now() AND coalesce(full_at, '-infinity') <= now() - $1::interval
		RETURNING true`, interval(every), interval(bound)); err != nil {
		return false, translateIn("claim the full pass", err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("reconcile: commit: %w", db.Translate(err))
	}
	return len(claimed) > 0, nil
}

// ReleaseFull gives up this replica's claim of the full pass (ClaimFull),
// after a pass that failed, so that the next tick of any replica tries
// again.
func ReleaseFull(ctx context.Context, primary *sqlx.DB) error {
	_, err := primary.ExecContext(ctx, `UPDATE reconcile_checkpoint SET full_claimed_until = NULL`)
	return translateIn("release the full pass", err)
}

// RecordFull writes down on primary what the full pass r, read on a
// standby, found: its findings (the first of each kind r holds), which
// the periodic passes then report until they find them resolved, or, the
// changed ones, until a person does; the checkpoint marked to be made
// anew when the transfers no longer sum to it (r.Checkpoint.Differs),
// unless the primary made it anew since; and the full pass's time. It
// waits for a periodic pass under way to end.
func RecordFull(ctx context.Context, primary *sqlx.DB, r Reconciliation) error {
	tx, err := primary.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("reconcile: begin: %w", db.Translate(err))
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, reconcileLock); err != nil {
		return translateIn("take the reconcile lock", err)
	}
	for _, kind := range []struct {
		name, subject string
		items         any
	}{{"drift", "account", r.Drift}, {"duplicate", "transfer_id", r.Duplicates}, {"waiting", "transfer_id", r.Waiting}} {
		b, err := json.Marshal(kind.items)
		if err != nil {
			return err
		}
		if string(b) == "null" {
			b = []byte("[]")
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO reconcile_finding AS f (kind, subject, detail)
			SELECT $1, x->>$2, x FROM jsonb_array_elements($3::jsonb) x
			ON CONFLICT (kind, subject) DO UPDATE SET detail = EXCLUDED.detail, last_seen = EXCLUDED.last_seen`,
			kind.name, kind.subject, string(b)); err != nil {
			return translateIn("write the findings", err)
		}
	}
	// The changed accounts this pass's comparison found (those r holds
	// without a first sighting: the others were read as kept), each named
	// by the checkpoint it was compared with (changedSubject).
	var found []Changed
	for _, c := range r.Changed {
		if c.FirstSeen == nil {
			found = append(found, c)
		}
	}
	b, err := json.Marshal(orNone(found))
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO reconcile_finding AS f (kind, subject, detail)
		SELECT 'changed', `+fmt.Sprintf(changedSubject, "(x->>'account')", "(x->>'checkpoint_made_at')::timestamptz", "NULL")+`, x - 'first_seen'
		FROM jsonb_array_elements($1::jsonb) x
		ON CONFLICT (kind, subject) DO UPDATE SET last_seen = EXCLUDED.last_seen`, string(b)); err != nil {
		return translateIn("write the findings", err)
	}
	if r.Checkpoint.Differs > 0 {
		why := fmt.Sprintf("the full pass of %s found the transfers of %d account(s) changed since the checkpoint's cut-off",
			r.At.UTC().Format(time.RFC3339), r.Checkpoint.Differs)
		if _, err := tx.ExecContext(ctx, `UPDATE reconcile_checkpoint SET distrust = $1 WHERE rebuilt_at IS NOT DISTINCT FROM $2`,
			why, r.Checkpoint.RebuiltAt); err != nil {
			return translateIn("mark the checkpoint", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE reconcile_checkpoint SET full_at = $1, full_claimed_until = NULL`, r.At); err != nil {
		return translateIn("record the full pass", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("reconcile: commit: %w", db.Translate(err))
	}
	return nil
}

// orNone makes a nil list [] in JSON.
func orNone[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
