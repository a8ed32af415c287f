package db

import (
	"errors"
	"strings"
	"testing"
	"time"

	"transferconsumer/event"
)

// A queue's mark is vouched for only at the sequence the database holds,
// and stays vouched for while the mark moves on in the same database and
// timeline; what a restore or a failover changes (the table's file, the
// timeline, the cluster, a transaction ahead of the database's) makes it
// not vouched for, with the reason.
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
	if seq, why := vouched(); seq != 0 || why == "" {
		t.Fatalf("a queue never marked: %d, %q; want 0 and why not", seq, why)
	}
	// A read that found no entry of a queue never marked vouches for 0:
	// the row is made there, and its first transaction moves it on, still
	// vouched for (a restart during an alarm then goes on from it).
	fresh := queue + "-fresh"
	if err := l.Vouch(ctx, fresh, 0, time.Now()); err != nil {
		t.Fatal(err)
	}
	if seq, why, err := l.Vouched(ctx, fresh); err != nil || seq != 0 || why != "" {
		t.Fatalf("a queue never marked, vouched for at 0: %d, %q, %v; want 0 and no doubt", seq, why, err)
	}
	if _, err := l.ApplyMarked(ctx, []event.Event{newEvent(t, newID(), event.TransferCreated, newID(), "acc_w", "acc_x", 1)},
		event.Mark{Queue: fresh, Prev: 0, Last: 1}); err != nil {
		t.Fatal(err)
	}
	if seq, why, err := l.Vouched(ctx, fresh); err != nil || seq != 1 || why != "" {
		t.Fatalf("its first transaction: %d, %q, %v; want 1 and no doubt", seq, why, err)
	}
	if err := l.Vouch(ctx, fresh, 0, time.Now()); err != nil { // a read that began before that transaction
		t.Fatal(err)
	}
	if seq, _, err := l.Vouched(ctx, fresh); err != nil || seq != 1 {
		t.Fatalf("a vouch for 0 after the mark moved to 1 moved it back to %d (%v)", seq, err)
	}
	ev := newEvent(t, newID(), event.TransferCreated, newID(), "acc_w", "acc_x", 1)
	if _, err := l.ApplyMarked(ctx, []event.Event{ev}, event.Mark{Queue: queue, Prev: 0, Last: 2}); err != nil {
		t.Fatal(err)
	}
	if _, why := vouched(); !strings.Contains(why, "no read") {
		t.Fatalf("a mark never vouched for: %q", why)
	}
	// At a mark the database does not hold: nothing recorded.
	if err := l.Vouch(ctx, queue, 5, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, why := vouched(); !strings.Contains(why, "no read") {
		t.Fatalf("vouched for at a mark the database does not hold: %q", why)
	}
	if err := l.Vouch(ctx, queue, 2, time.Now()); err != nil {
		t.Fatal(err)
	}
	if seq, why := vouched(); seq != 2 || why != "" {
		t.Fatalf("vouched for at 2: %d, %q; want 2 and no doubt", seq, why)
	}
	if _, err := l.ApplyMarked(ctx, nil, event.Mark{Queue: queue, Prev: 2, Last: 7}); err != nil {
		t.Fatal(err)
	}
	if seq, why := vouched(); seq != 7 || why != "" {
		t.Fatalf("the mark moved on: %d, %q; want 7 and no doubt", seq, why)
	}

	for _, tt := range []struct{ name, edit, why string }{
		{"another timeline", `UPDATE journal_mark SET vouched_timeline = vouched_timeline + 1`, "timeline"},
		{"another cluster", `UPDATE journal_mark SET vouched_system = vouched_system + 1`, "another cluster"},
		{"the table made anew", `UPDATE journal_mark SET vouched_file = vouched_file + 1`, "made anew"},
		{"a transaction ahead", `UPDATE journal_mark SET vouched_by = (pg_snapshot_xmax(pg_current_snapshot())::text::bigint + 1000)::text::xid8`, "ahead"},
	} {
		if err := l.Vouch(ctx, queue, 7, time.Now()); err != nil {
			t.Fatal(err)
		}
		if _, err := in.db.Exec(tt.edit+` WHERE queue = $1`, queue); err != nil {
			t.Fatal(err)
		}
		if _, why := vouched(); !strings.Contains(why, tt.why) {
			t.Errorf("%s: %q, want it to say %q", tt.name, why, tt.why)
		}
	}
	// A restore's TRUNCATE gives the table another file.
	if err := l.Vouch(ctx, queue, 7, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := in.db.Exec(`CREATE TEMP TABLE keep AS SELECT * FROM journal_mark; TRUNCATE journal_mark; INSERT INTO journal_mark SELECT * FROM keep`); err != nil {
		t.Fatal(err)
	}
	if _, why := vouched(); !strings.Contains(why, "made anew") {
		t.Errorf("after a TRUNCATE and the rows put back: %q, want it made anew", why)
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

// A transaction that is not a restore's moves a queue's mark only while a
// read of the journal vouched for it in this database as it is now
// (journal_vouched_here): never vouched for, or vouched for before a
// failover or a restore (another timeline, cluster or table file), it
// fails with ErrJournalGap and applies nothing, so that the lane reads
// the journal before it takes sequences another consumer of the queue may
// have journaled and the database lost. A restore's moves go on, and the
// read's vouch lets the queue's transactions move it again. VouchedHere
// says the same in one simple query.
func TestAMarkMovesOnlyWhileVouchedForInThisDatabase(t *testing.T) {
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
	here := func(want int64) bool {
		t.Helper()
		seq, here, err := l.VouchedHere(ctx, queue)
		if err != nil || seq != want {
			t.Fatalf("VouchedHere: %d, %v; want mark %d", seq, err, want)
		}
		return here
	}
	if seq, here, err := l.VouchedHere(ctx, queue); err != nil || seq != 0 || here {
		t.Fatalf("a queue never marked: %d, %v, %v; want 0, not vouched for", seq, here, err)
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
	if err := next(0); err != nil { // the row is made, not vouched for
		t.Fatal(err)
	}
	if here(1) {
		t.Fatalf("a mark no read vouched for is vouched for here")
	}
	if err := next(1); !errors.Is(err, event.ErrJournalGap) || !strings.Contains(err.Error(), "vouched") {
		t.Fatalf("moving a mark no read vouched for: %v, want ErrJournalGap saying why", err)
	}
	if err := l.Vouch(ctx, queue, 1, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !here(1) {
		t.Fatalf("vouched for at 1, and not here")
	}
	if err := next(1); err != nil {
		t.Fatalf("moving a vouched mark: %v", err)
	}
	if !here(2) {
		t.Fatalf("a vouched mark moved on in the same database is no longer vouched for here")
	}
	for _, tt := range []struct{ name, edit string }{
		{"another timeline (a failover, a point-in-time restore)", `UPDATE journal_mark SET vouched_timeline = vouched_timeline + 1`},
		{"another cluster", `UPDATE journal_mark SET vouched_system = vouched_system + 1`},
		{"the table made anew (a logical restore)", `UPDATE journal_mark SET vouched_file = vouched_file + 1`},
	} {
		if err := l.Vouch(ctx, queue, 2, time.Now()); err != nil {
			t.Fatal(err)
		}
		if _, err := in.db.Exec(tt.edit+` WHERE queue = $1`, queue); err != nil {
			t.Fatal(err)
		}
		if here(2) {
			t.Errorf("%s: still vouched for here", tt.name)
		}
		if err := next(2); !errors.Is(err, event.ErrJournalGap) {
			t.Errorf("%s: the mark moved (%v), want ErrJournalGap", tt.name, err)
		}
	}
	if _, err := l.ApplyMarked(ctx, nil, event.Mark{Queue: queue, Prev: 2, Last: 5, Restore: true}); err != nil {
		t.Fatalf("a restore's move of a mark not vouched for here: %v", err)
	}
	if err := l.Vouch(ctx, queue, 5, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := next(5); err != nil {
		t.Fatalf("after the restore's read vouched for it: %v", err)
	}
}
