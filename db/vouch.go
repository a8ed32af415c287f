package db

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// The journal mark's voucher (sql/0017_journal_mark_vouched.sql,
// adr/0014): what lets a queue's lane go on from its mark without reading
// the journal while an alarm holds the read.

// Which database vouched is journal_here's (sql/functions): a database
// created anew (a logical restore into another one) has another oid, a
// table emptied and filled again (TRUNCATE, a restore with --clean)
// another file, a failover or a point-in-time restore another timeline.

// Vouch records in queue's journal mark that the database holds every
// entry of the queue the journal holds, up to mark: the journal's lane
// calls it once a read of the journal synced it. Nothing is recorded when
// the database no longer holds mark. A queue never marked (mark 0: the
// read found no entry of it) gets its row at 0 here, vouched for, which
// its first transaction moves on (journal_advance): a service's first
// read, before any event, would otherwise vouch for nothing, and a
// restart during an alarm would find every queue it marked since
// unvouched. It implements the journal's Voucher.
//
// It also raises the mark's time to when the read began (began, taken to
// the database's clock by the time elapsed since), unless the mark moved
// later: the journal held no entry of the queue above mark before then,
// so a later read of the queue may start there (sql/0014). An idle queue's
// read at a start thus goes back to the last read that synced it, not to
// when its mark last moved, days ago perhaps.
//
// One simple-protocol Query, as Marked.
func (l *lane) Vouch(ctx context.Context, queue string, mark int64, began time.Time) error {
	const identity = "h.system, h.database, h.file, h.timeline, pg_current_xact_id()"
	var readAt strings.Builder // when the read began, in the database's clock
	readAt.WriteString("now() - ")
	writeInt(&readAt, max(time.Since(began), 0).Microseconds())
	readAt.WriteString(" * interval '1 microsecond'")
	var q strings.Builder
	if mark == 0 {
		q.WriteString("INSERT INTO journal_mark AS m (queue, seq, at, vouched_system, vouched_database, vouched_file, vouched_timeline, vouched_by) SELECT ")
		writeText(&q, queue)
		q.WriteString(", 0, " + readAt.String() + ", " + identity + " FROM journal_here() h ON CONFLICT (queue) DO UPDATE SET (at, vouched_system, vouched_database, vouched_file, vouched_timeline, vouched_by) = " +
			"(greatest(m.at, EXCLUDED.at), EXCLUDED.vouched_system, EXCLUDED.vouched_database, EXCLUDED.vouched_file, EXCLUDED.vouched_timeline, EXCLUDED.vouched_by) WHERE m.seq = 0")
	} else {
		q.WriteString("UPDATE journal_mark SET (at, vouched_system, vouched_database, vouched_file, vouched_timeline, vouched_by) = (SELECT greatest(at, " +
			readAt.String() + "), " + identity + " FROM journal_here() h) WHERE queue = ")
		writeText(&q, queue)
		q.WriteString(" AND seq = ")
		writeInt(&q, mark)
	}
	if _, err := l.in.db.ExecContext(ctx, q.String()); err != nil {
		return fmt.Errorf("vouch for the journal mark of %s: %w", queue, translate(err))
	}
	return nil
}

// vouchedSQL reads a queue's mark, and why the database may have lost
// commits since it was last vouched for (NULL: it cannot have, within
// PostgreSQL's durability on one timeline).
const vouchedSQL = `SELECT m.seq, CASE
    WHEN m.vouched_by IS NULL THEN 'no read of the journal has vouched for it'
    WHEN m.vouched_system IS DISTINCT FROM s.system OR s.system = 0
        THEN 'it was vouched for in another cluster, or the cluster cannot be read'
    WHEN m.vouched_database IS DISTINCT FROM s.database OR m.vouched_file IS DISTINCT FROM s.file
        THEN 'the database or its journal_mark table was made anew since (a restore)'
    WHEN s.timeline IS NULL THEN 'the timeline cannot be read (a standby, or a role that may not ask)'
    WHEN m.vouched_timeline IS DISTINCT FROM s.timeline
        THEN format('it was vouched for on timeline %s, the database is on %s: a failover or a point-in-time restore since', m.vouched_timeline, s.timeline)
    WHEN m.vouched_by >= pg_snapshot_xmax(pg_current_snapshot())
        THEN 'its transaction is ahead of the database''s own: a restore'
    WHEN pg_xact_status(m.vouched_by) IS DISTINCT FROM 'committed'
        THEN 'its transaction is not known committed here'
    WHEN current_setting('fsync') <> 'on' OR current_setting('synchronous_commit') = 'off'
        THEN 'the server may lose commits in a crash (fsync or synchronous_commit is off)'
    END AS why
FROM journal_mark m, journal_here() s
WHERE m.queue = `

// Vouched returns queue's journal mark, and "" when the database can have
// lost no commit of the queue since a read of the journal last vouched
// for it (Vouch), or else why it may have. It implements the journal's
// Voucher.
func (l *lane) Vouched(ctx context.Context, queue string) (int64, string, error) {
	var row struct {
		Seq int64          `db:"seq"`
		Why sql.NullString `db:"why"`
	}
	var q strings.Builder
	q.WriteString(vouchedSQL)
	writeText(&q, queue)
	err := l.in.db.GetContext(ctx, &row, q.String())
	if errors.Is(err, sql.ErrNoRows) {
		return 0, "the queue has no mark", nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("read the journal mark of %s and its voucher: %w", queue, translate(err))
	}
	return row.Seq, row.Why.String, nil
}

// VouchedHere returns queue's journal mark, and whether a read of the
// journal vouched for it in this database as it is now (the same
// cluster, database, table file and timeline: journal_vouched_here), so
// that whoever moved it since, no commit of the queue can have been lost.
// journal_advance requires it of every transaction that is not a
// restore's; the journal's watch asks it of a lane it holds synced, so
// that an idle queue is restored after a failover that took back what
// another consumer of it had applied. One simple-protocol Query, as
// Marked. It implements the journal's Voucher.
func (l *lane) VouchedHere(ctx context.Context, queue string) (int64, bool, error) {
	var row struct {
		Seq  int64 `db:"seq"`
		Here bool  `db:"here"`
	}
	var q strings.Builder
	q.WriteString("SELECT m.seq, journal_vouched_here(m) AS here FROM journal_mark m WHERE m.queue = ")
	writeText(&q, queue)
	err := l.in.db.GetContext(ctx, &row, q.String())
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read the journal mark of %s and whether it is vouched for here: %w", queue, translate(err))
	}
	return row.Seq, row.Here, nil
}
