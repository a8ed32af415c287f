package db

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"transferconsumer/event"

	"github.com/lib/pq"
)

// A queue's mark is vouched for only at the sequence the database holds,
// and stays vouched for while the mark moves on; a restore's move makes it
// not vouched for until the read that made it vouches again, and so does
// a data-only restore of its row (the row written again by another
// transaction than the one it names), with the reason. That a restart,
// and every restore that starts the server again, makes it not vouched
// for is shown on servers of the tests' own (integration,
// TestTheJournalMarkIsTrustedOnlyInTheServersRunThatWroteIt).
func TestAMarkIsVouchedForUntilTheDatabaseMayHaveLostCommits(t *testing.T) {
	in := NewInbox(testDB(t, 4))
	l := in.Lane(0).(*lane)
	defer l.Close()
	ctx := t.Context()
	queue := `q'\` + newID()
	vouched := func() (int64, string) {
		t.Helper()
		seq, why, err := l.Vouched(ctx, queue)
		if err != nil {
			t.Fatal(err)
		}
		return seq, why
	}
	if seq, why := vouched(); seq != 0 || !strings.Contains(why, "no mark") {
		t.Fatalf("a queue never marked: %d, %q; want 0 and that it has no mark", seq, why)
	}
	// A read that found no entry of a queue never marked vouches for 0:
	// the row is made there, and its first transaction moves it on, still
	// vouched for (a restart during an alarm then goes on from it).
	if err := l.Vouch(ctx, queue, 0, time.Now()); err != nil {
		t.Fatal(err)
	}
	if seq, why := vouched(); seq != 0 || why != "" {
		t.Fatalf("a queue never marked, vouched for at 0: %d, %q; want 0 and no doubt", seq, why)
	}
	if _, err := l.ApplyMarked(ctx, []event.Event{newEvent(t, newID(), event.TransferCreated, newID(), "acc_w", "acc_x", 1)},
		event.Mark{Queue: queue, Prev: 0, Last: 1}); err != nil {
		t.Fatal(err)
	}
	if seq, why := vouched(); seq != 1 || why != "" {
		t.Fatalf("its first transaction: %d, %q; want 1 and no doubt", seq, why)
	}
	if err := l.Vouch(ctx, queue, 0, time.Now()); err != nil { // a read that began before that transaction
		t.Fatal(err)
	}
	if seq, _ := vouched(); seq != 1 {
		t.Fatalf("a vouch for 0 after the mark moved to 1 moved it back to %d", seq)
	}
	// A restore's move: not vouched for until its read vouches.
	if _, err := l.ApplyMarked(ctx, nil, event.Mark{Queue: queue, Prev: 1, Last: 7, Restore: true}); err != nil {
		t.Fatal(err)
	}
	if seq, why := vouched(); seq != 7 || !strings.Contains(why, "restore moved it") {
		t.Fatalf("after a restore's move: %d, %q; want 7 and that a restore moved it", seq, why)
	}
	// At a mark the database does not hold: nothing recorded.
	if err := l.Vouch(ctx, queue, 5, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, why := vouched(); why == "" {
		t.Fatalf("vouched for at a mark the database does not hold")
	}
	if err := l.Vouch(ctx, queue, 7, time.Now()); err != nil {
		t.Fatal(err)
	}
	if seq, why := vouched(); seq != 7 || why != "" {
		t.Fatalf("vouched for at 7: %d, %q; want 7 and no doubt", seq, why)
	}
	if _, err := l.ApplyMarked(ctx, nil, event.Mark{Queue: queue, Prev: 7, Last: 9}); err != nil {
		t.Fatal(err)
	}
	if seq, why := vouched(); seq != 9 || why != "" {
		t.Fatalf("the mark moved on: %d, %q; want 9 and no doubt", seq, why)
	}
	// A data-only restore: the row saved at 9, moved on, then put back as
	// a restore puts rows back (deleted, and inserted by another
	// transaction), as it was when vouched for.
	if _, err := in.db.Exec(`CREATE TABLE saved_mark AS SELECT * FROM journal_mark WHERE queue = $1`, queue); err != nil {
		t.Fatal(err)
	}
	if _, err := l.ApplyMarked(ctx, nil, event.Mark{Queue: queue, Prev: 9, Last: 12}); err != nil {
		t.Fatal(err)
	}
	if _, err := in.db.Exec(`DELETE FROM journal_mark WHERE queue = $1`, queue); err != nil {
		t.Fatal(err)
	}
	if _, err := in.db.Exec(`INSERT INTO journal_mark SELECT * FROM saved_mark`); err != nil {
		t.Fatal(err)
	}
	if seq, why := vouched(); seq != 9 || !strings.Contains(why, "copied or restored") {
		t.Errorf("a row put back by a data-only restore: %d, %q; want 9 and that it was restored", seq, why)
	}
}

// A vouch raises the mark's time to when the read that synced the queue
// began, in the database's clock, so that the next read of an idle queue
// starts there, not where its mark last moved; it never lowers it (a mark
// that moved after the read began), and a vouch at a mark the database
// no longer holds changes nothing.
func TestAVouchMovesTheMarksTimeToTheStartOfTheReadThatSyncedIt(t *testing.T) {
	in := NewInbox(testDB(t, 4))
	l := in.Lane(0).(*lane)
	defer l.Close()
	ctx := t.Context()
	queue := "q-" + newID()
	at := func() time.Time {
		t.Helper()
		_, at, err := l.Marked(ctx, queue)
		if err != nil {
			t.Fatal(err)
		}
		return at
	}
	dbNow := func() time.Time {
		t.Helper()
		var now time.Time
		if err := in.db.Get(&now, `SELECT now()`); err != nil {
			t.Fatal(err)
		}
		return now
	}
	// vouch vouches for mark after a read that began ago before, and
	// returns the bounds its time must lie in: the database's clock
	// before and after, less ago and the call's own time.
	vouch := func(mark int64, ago time.Duration) (time.Time, time.Time) {
		t.Helper()
		before, start := dbNow(), time.Now()
		if err := l.Vouch(ctx, queue, mark, start.Add(-ago)); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		return before.Add(-ago - took), dbNow().Add(-ago)
	}
	within := func(what string, got, lo, hi time.Time) {
		t.Helper()
		if got.Before(lo) || got.After(hi) {
			t.Errorf("%s: the mark's time is %s, want it in [%s, %s]", what, got.Format(time.RFC3339Nano),
				lo.Format(time.RFC3339Nano), hi.Format(time.RFC3339Nano))
		}
	}
	// A queue never marked: its row is made at 0, at the read's start.
	lo, hi := vouch(0, 5*time.Second)
	within("a queue never marked, vouched for", at(), lo, hi)
	if _, err := l.ApplyMarked(ctx, nil, event.Mark{Queue: queue, Prev: 0, Last: 3}); err != nil {
		t.Fatal(err)
	}
	// An idle queue: its mark last moved an hour ago.
	if _, err := in.db.Exec(`UPDATE journal_mark SET at = now() - interval '1 hour' WHERE queue = $1`, queue); err != nil {
		t.Fatal(err)
	}
	idle := at()
	lo, hi = vouch(3, 2*time.Second)
	within("an idle queue's mark, vouched for by a read that began 2s ago", at(), lo, hi)
	read := at()
	// A read that began before the mark's time does not move it back.
	vouch(3, 2*time.Hour)
	if got := at(); !got.Equal(read) {
		t.Errorf("a vouch by a read that began before the mark's time moved it from %s to %s", read, got)
	}
	// Nor does a vouch at a mark the database does not hold.
	if _, err := in.db.Exec(`UPDATE journal_mark SET at = $2 WHERE queue = $1`, queue, idle); err != nil {
		t.Fatal(err)
	}
	vouch(2, 0)
	if got := at(); !got.Equal(idle) {
		t.Errorf("a vouch at 2, the database holding 3, moved the mark's time from %s to %s", idle, got)
	}
}

// A transaction that is not a restore's moves a queue's mark only while
// the database vouches for it (journal_mark_doubt): never vouched for, its
// row gone (a restore to before the queue was first marked), moved by a
// restore whose read has not ended, or its row restored, the transaction
// fails with ErrJournalGap and applies nothing, so that the lane reads the
// journal before it takes sequences another consumer of the queue may have
// journaled and the database lost. A restore's moves go on, and the read's
// vouch lets the queue's transactions move it again.
func TestAMarkMovesOnlyWhileVouchedFor(t *testing.T) {
	in := NewInbox(testDB(t, 4))
	l := in.Lane(0).(*lane)
	defer l.Close()
	ctx := t.Context()
	queue := "q-" + newID()
	applied := func(ev event.Event) bool {
		t.Helper()
		var n int
		if err := in.db.Get(&n, `SELECT count(*) FROM processed_event WHERE event_id = $1`, ev.ID); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	next := func(prev int64) error {
		t.Helper()
		ev := newEvent(t, newID(), event.TransferCreated, newID(), "acc_v", "acc_y", 1)
		_, err := l.ApplyMarked(ctx, []event.Event{ev}, event.Mark{Queue: queue, Prev: prev, Last: prev + 1})
		if err != nil && applied(ev) {
			t.Fatalf("a refused transaction applied its event: %v", err)
		}
		return err
	}
	refused := func(what string, prev int64, says string) {
		t.Helper()
		if err := next(prev); !errors.Is(err, event.ErrJournalGap) || !strings.Contains(err.Error(), says) {
			t.Errorf("%s: %v, want ErrJournalGap saying %q", what, err, says)
		}
	}
	refused("a queue without a row", 0, "no mark")
	if err := l.Vouch(ctx, queue, 0, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := next(0); err != nil {
		t.Fatalf("moving a mark vouched for at 0: %v", err)
	}
	if err := next(1); err != nil {
		t.Fatalf("moving it on: %v", err)
	}
	// Its row gone, as after a restore to before the queue was marked.
	if _, err := in.db.Exec(`CREATE TABLE saved_mark AS SELECT * FROM journal_mark WHERE queue = $1`, queue); err != nil {
		t.Fatal(err)
	}
	if _, err := in.db.Exec(`DELETE FROM journal_mark WHERE queue = $1`, queue); err != nil {
		t.Fatal(err)
	}
	refused("its row gone, the lane at 0", 0, "no mark")
	refused("its row gone, the lane at 2", 2, "no mark")
	if _, err := in.db.Exec(`INSERT INTO journal_mark SELECT * FROM saved_mark`); err != nil {
		t.Fatal(err)
	}
	refused("its row put back by a data-only restore", 2, "restored in")
	if _, err := l.ApplyMarked(ctx, nil, event.Mark{Queue: queue, Prev: 2, Last: 5, Restore: true}); err != nil {
		t.Fatalf("a restore's move of a mark not vouched for: %v", err)
	}
	refused("moved by a restore whose read has not ended", 5, "restore moved it")
	if err := l.Vouch(ctx, queue, 5, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := next(5); err != nil {
		t.Fatalf("after the restore's read vouched for it: %v", err)
	}
}

// A release before sql/0018, running beside this one during a rolling
// deploy, records a read's vouch as it did (the cluster, database, file
// and timeline, and vouched_by: its Vouch's statement, as it sends it):
// the trigger of 0018 turns that into this release's record, so that its
// lanes' transactions, which run this release's journal_advance, go on;
// and this release's Vouched trusts it as its own.
func TestAnOlderReleasesVouchLetsItsLanesGoOn(t *testing.T) {
	in := NewInbox(testDB(t, 4))
	l := in.Lane(0).(*lane)
	defer l.Close()
	ctx := t.Context()
	queue := "q-" + newID()
	older := func(mark int64) {
		t.Helper()
		q := `UPDATE journal_mark SET (at, vouched_system, vouched_database, vouched_file, vouched_timeline, vouched_by) = ` +
			`(SELECT greatest(at, now()), h.system, h.database, h.file, h.timeline, pg_current_xact_id() FROM journal_here() h) ` +
			`WHERE queue = ` + pq.QuoteLiteral(queue) + ` AND seq = ` + strconv.FormatInt(mark, 10)
		if mark == 0 {
			q = `INSERT INTO journal_mark AS m (queue, seq, at, vouched_system, vouched_database, vouched_file, vouched_timeline, vouched_by) ` +
				`SELECT ` + pq.QuoteLiteral(queue) + `, 0, now(), h.system, h.database, h.file, h.timeline, pg_current_xact_id() FROM journal_here() h ` +
				`ON CONFLICT (queue) DO UPDATE SET (at, vouched_system, vouched_database, vouched_file, vouched_timeline, vouched_by) = ` +
				`(greatest(m.at, EXCLUDED.at), EXCLUDED.vouched_system, EXCLUDED.vouched_database, EXCLUDED.vouched_file, ` +
				`EXCLUDED.vouched_timeline, EXCLUDED.vouched_by) WHERE m.seq = 0`
		}
		if _, err := in.db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	older(0)
	if _, why, err := l.Vouched(ctx, queue); err != nil || why != "" {
		t.Fatalf("a queue an older release vouched for at 0: %q (%v), want no doubt", why, err)
	}
	if _, err := l.ApplyMarked(ctx, nil, event.Mark{Queue: queue, Prev: 0, Last: 3}); err != nil {
		t.Fatalf("its lane's first transaction: %v", err)
	}
	if _, err := l.ApplyMarked(ctx, nil, event.Mark{Queue: queue, Prev: 3, Last: 5, Restore: true}); err != nil {
		t.Fatal(err)
	}
	older(5)
	if _, err := l.ApplyMarked(ctx, nil, event.Mark{Queue: queue, Prev: 5, Last: 6}); err != nil {
		t.Fatalf("after its restore's read vouched for the mark: %v", err)
	}
	var left int
	if err := in.db.Get(&left, `SELECT count(*) FROM journal_mark WHERE vouched_system IS NOT NULL OR vouched_timeline IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d rows keep the older record, which a restore would bring back", left)
	}
}
