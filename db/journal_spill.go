package db

import (
	"context"
	"fmt"
	"strings"
	"time"

	"transferconsumer/event"
)

// The journal's spill (sql/0015_journal_spill.sql, adr/0014): where a
// queue's journal messages wait while the stream does not take them. Each
// statement is one simple Query message with its values as literals, as
// the apply path's are, so that it works behind PgBouncer in transaction
// mode; none is on an event's path, only on the journal's writer's.

// Spill keeps msgs, queue's, in journal_spill, when the database holds
// their commits: its mark of the queue is at or past their last sequence.
// Otherwise (a failover or a restore took those commits back) it keeps
// nothing and fails: the entries stay on their way to the stream, which
// a restore needs them in, since it reads the stream for what is above
// the mark. So a kept entry is never above the database's mark, and a
// restore never waits for the kept ones. It implements
// event.JournalSpill.
func (in *Inbox) Spill(ctx context.Context, queue string, msgs []event.Spilled) error {
	if len(msgs) == 0 {
		return nil
	}
	last := msgs[len(msgs)-1].Last
	var b strings.Builder
	b.WriteString("WITH held AS (SELECT 1 FROM journal_mark WHERE queue = ")
	writeText(&b, queue)
	b.WriteString(" AND seq >= ")
	writeInt(&b, last)
	b.WriteString("), kept AS (INSERT INTO journal_spill (queue, first_seq, last_seq, entries, body) SELECT * FROM (VALUES ")
	for i, m := range msgs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		writeText(&b, queue)
		b.WriteString(", ")
		writeInt(&b, m.First)
		b.WriteString("::bigint, ")
		writeInt(&b, m.Last)
		b.WriteString("::bigint, ")
		writeInt(&b, int64(m.Entries))
		b.WriteString("::int, ")
		writeBytes(&b, m.Body)
		b.WriteString("::bytea)")
	}
	b.WriteString(") AS m WHERE EXISTS (SELECT 1 FROM held) ON CONFLICT (queue, first_seq) DO NOTHING) SELECT EXISTS (SELECT 1 FROM held)")
	var held bool
	if err := in.db.GetContext(ctx, &held, b.String()); err != nil {
		return fmt.Errorf("keep %d journal messages of %s in the database: %w", len(msgs), queue, translate(err))
	}
	if !held {
		return fmt.Errorf("keep %d journal messages of %s in the database: it does not hold their commits (its mark is below %d: a failover or a restore took them back), "+
			"so they wait for the stream, which a restore reads them from", len(msgs), queue, last)
	}
	return nil
}

// Spilled returns up to limit of queue's kept journal messages, oldest
// first. It implements event.JournalSpill.
func (in *Inbox) Spilled(ctx context.Context, queue string, limit int) ([]event.Spilled, error) {
	var b strings.Builder
	b.WriteString("SELECT first_seq, last_seq, entries, body FROM journal_spill WHERE queue = ")
	writeText(&b, queue)
	b.WriteString(" ORDER BY first_seq LIMIT ")
	writeInt(&b, int64(limit))
	var rows []struct {
		First   int64  `db:"first_seq"`
		Last    int64  `db:"last_seq"`
		Entries int    `db:"entries"`
		Body    []byte `db:"body"`
	}
	if err := in.db.SelectContext(ctx, &rows, b.String()); err != nil {
		return nil, fmt.Errorf("read the journal messages of %s kept in the database: %w", queue, translate(err))
	}
	out := make([]event.Spilled, len(rows))
	for i, r := range rows {
		out[i] = event.Spilled{First: r.First, Last: r.Last, Entries: r.Entries, Body: r.Body}
	}
	return out, nil
}

// Unspill deletes queue's kept journal messages up to sequence last. It
// implements event.JournalSpill.
func (in *Inbox) Unspill(ctx context.Context, queue string, last int64) error {
	var b strings.Builder
	b.WriteString("DELETE FROM journal_spill WHERE queue = ")
	writeText(&b, queue)
	b.WriteString(" AND last_seq <= ")
	writeInt(&b, last)
	if _, err := in.db.ExecContext(ctx, b.String()); err != nil {
		return fmt.Errorf("delete the journal messages of %s the stream took: %w", queue, translate(err))
	}
	return nil
}

// Kept returns the sequences of queue's kept journal messages, as runs
// of consecutive sequences, oldest first, each with when its first
// message was kept: the messages of one run follow each other without a
// gap (a message that overlaps the run so far joins it too). It
// implements event.JournalSpill.
func (in *Inbox) Kept(ctx context.Context, queue string) ([]event.KeptRun, error) {
	var b strings.Builder
	b.WriteString("SELECT min(first_seq) AS first, max(last_seq) AS last, min(at) AS at FROM (" +
		"SELECT first_seq, last_seq, at, count(*) FILTER (WHERE first_seq > coalesce(reach, first_seq - 2) + 1) OVER (ORDER BY first_seq) AS run FROM (" +
		"SELECT first_seq, last_seq, at, max(last_seq) OVER (ORDER BY first_seq ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach " +
		"FROM journal_spill WHERE queue = ")
	writeText(&b, queue)
	b.WriteString(") m) r GROUP BY run ORDER BY first")
	var rows []struct {
		First int64     `db:"first"`
		Last  int64     `db:"last"`
		At    time.Time `db:"at"`
	}
	if err := in.db.SelectContext(ctx, &rows, b.String()); err != nil {
		return nil, fmt.Errorf("read which journal entries of %s are kept in the database: %w", queue, translate(err))
	}
	out := make([]event.KeptRun, len(rows))
	for i, r := range rows {
		out[i] = event.KeptRun{First: r.First, Last: r.Last, At: r.At}
	}
	return out, nil
}

// Mark returns queue's journal mark (0 for a queue never marked): the
// journal's writer reads it when messages it kept are gone, to tell
// whether their commits went with them. It implements
// event.JournalSpill.
func (in *Inbox) Mark(ctx context.Context, queue string) (int64, error) {
	var b strings.Builder
	b.WriteString("SELECT coalesce((SELECT seq FROM journal_mark WHERE queue = ")
	writeText(&b, queue)
	b.WriteString("), 0)")
	var seq int64
	if err := in.db.GetContext(ctx, &seq, b.String()); err != nil {
		return 0, fmt.Errorf("read the journal mark of %s: %w", queue, translate(err))
	}
	return seq, nil
}

// ParkMarked parks l, a dead letter, in dead_letter_outbox as Park does,
// and moves the journal's mark from m.Prev to m.Last in the same
// transaction and the same round trip, so that the journal holds the
// letter as an entry of its queue (adr/0014): a failover or a restore that
// takes this commit back is found by the mark, and the restore parks the
// letter again. A gap (event.ErrJournalGap) fails it before it parks
// anything. It implements the journal's MarkedParker.
func (l *lane) ParkMarked(ctx context.Context, lt event.OutboxLetter, m event.Mark) error {
	var id int64
	call := func(b *strings.Builder) error {
		b.WriteString("WITH moved AS (SELECT true")
		writeMark(b, &m)
		b.WriteString(") ")
		writeLetterInsert(b, lt)
		b.WriteString(" FROM moved RETURNING id")
		return nil
	}
	if err := l.run(ctx, call, &id); err != nil {
		return fmt.Errorf("park the dead letter of event %s with the journal's mark of %s: %w", lt.EventID, m.Queue, translate(err))
	}
	if lt.Abandoned != nil {
		l.in.holdParked(ctx, id, lt.Abandoned)
	}
	return nil
}
