package db

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// The journal mark's voucher (sql/0018_journal_mark_run.sql, adr/0014):
// what lets a queue's lane go on from its mark without reading the
// journal, and what its transactions require to move the mark
// (journal_advance). Whether a mark is trusted is journal_mark_doubt's, in
// SQL, the one definition of it: this file only asks it.

// syncedCommit raises synchronous_commit to on for the statement's
// transaction, as pin_transaction does, when a database or role default
// says otherwise: a row that says the database lost no commit must itself
// not be lost by a crash of the server.
const syncedCommit = "SELECT CASE WHEN current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') " +
	"THEN set_config('synchronous_commit', 'on', true) END; "

// Vouch records in queue's journal mark that the database holds every
// entry of the queue the journal holds, up to mark: the journal's lane
// calls it once a read of the journal synced it. The row then names the
// transaction that wrote it and the server's run (journal_mark_doubt),
// until a restore's move or a restart. Nothing is recorded when the
// database no longer holds mark. A queue never marked (mark 0: the read
// found no entry of it) gets its row at 0 here, vouched for, which its
// first transaction moves on (journal_advance, which makes no row): a
// service's first read, before any event, would otherwise vouch for
// nothing. It implements the journal's Voucher.
//
// It also raises the mark's time to when the read began (began, taken to
// the database's clock by the time elapsed since), unless the mark moved
// later: the journal held no entry of the queue above mark before then,
// so a later read of the queue may start there (sql/0014). An idle queue's
// read at a start thus goes back to the last read that synced it, not to
// when its mark last moved, days ago perhaps.
//
// One simple-protocol Query (its statements one transaction), as Marked.
func (l *lane) Vouch(ctx context.Context, queue string, mark int64, began time.Time) error {
	const vouched = "pg_current_xact_id(), pg_postmaster_start_time()"
	var readAt strings.Builder // when the read began, in the database's clock
	readAt.WriteString("now() - ")
	writeInt(&readAt, max(time.Since(began), 0).Microseconds())
	readAt.WriteString(" * interval '1 microsecond'")
	var q strings.Builder
	q.WriteString(syncedCommit)
	if mark == 0 {
		q.WriteString("INSERT INTO journal_mark AS m (queue, seq, at, vouched_by, vouched_run) VALUES (")
		writeText(&q, queue)
		q.WriteString(", 0, " + readAt.String() + ", " + vouched + ") ON CONFLICT (queue) DO UPDATE SET (at, vouched_by, vouched_run) = " +
			"(greatest(m.at, EXCLUDED.at), EXCLUDED.vouched_by, EXCLUDED.vouched_run) WHERE m.seq = 0")
	} else {
		q.WriteString("UPDATE journal_mark SET (at, vouched_by, vouched_run) = (greatest(at, " + readAt.String() + "), " +
			vouched + ") WHERE queue = ")
		writeText(&q, queue)
		q.WriteString(" AND seq = ")
		writeInt(&q, mark)
	}
	if _, err := l.in.db.ExecContext(ctx, q.String()); err != nil {
		return fmt.Errorf("vouch for the journal mark of %s: %w", queue, translate(err))
	}
	return nil
}

// Vouched returns queue's journal mark, and "" when the database vouches
// that it has lost no commit of the queue since a read of the journal
// last synced it (journal_mark_doubt), or else why it may have. The
// journal's lane asks it when a read cannot begin (a start, a restore) and
// when its watch finds an idle queue's mark where the lane left it. One
// simple-protocol Query, as Marked. It implements the journal's Voucher.
func (l *lane) Vouched(ctx context.Context, queue string) (int64, string, error) {
	var row struct {
		Seq int64          `db:"seq"`
		Why sql.NullString `db:"why"`
	}
	var q strings.Builder
	q.WriteString("SELECT m.seq, journal_mark_doubt(m.xmin, m.vouched_by, m.vouched_run) AS why FROM journal_mark m WHERE m.queue = ")
	writeText(&q, queue)
	err := l.in.db.GetContext(ctx, &row, q.String())
	if errors.Is(err, sql.ErrNoRows) {
		return 0, "the queue has no mark (a restore to before it was first marked, or no read of the journal has synced it)", nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("read the journal mark of %s and whether it is vouched for: %w", queue, translate(err))
	}
	return row.Seq, row.Why.String, nil
}
