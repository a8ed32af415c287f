package db

import (
	"strings"
	"testing"

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
	if err := l.Vouch(ctx, fresh, 0); err != nil {
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
	if err := l.Vouch(ctx, fresh, 0); err != nil { // a read that began before that transaction
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
	if err := l.Vouch(ctx, queue, 5); err != nil {
		t.Fatal(err)
	}
	if _, why := vouched(); !strings.Contains(why, "no read") {
		t.Fatalf("vouched for at a mark the database does not hold: %q", why)
	}
	if err := l.Vouch(ctx, queue, 2); err != nil {
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
		if err := l.Vouch(ctx, queue, 7); err != nil {
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
	if err := l.Vouch(ctx, queue, 7); err != nil {
		t.Fatal(err)
	}
	if _, err := in.db.Exec(`CREATE TEMP TABLE keep AS SELECT * FROM journal_mark; TRUNCATE journal_mark; INSERT INTO journal_mark SELECT * FROM keep`); err != nil {
		t.Fatal(err)
	}
	if _, why := vouched(); !strings.Contains(why, "made anew") {
		t.Errorf("after a TRUNCATE and the rows put back: %q, want it made anew", why)
	}
}
