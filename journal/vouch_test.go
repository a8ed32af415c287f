package journal

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"transferconsumer/event"
)

// A lane whose read of the journal cannot begin (a broker alarm holds its
// fence) goes on from the database's mark when the database vouches that
// it lost no commit since a read synced the queue: a replica started
// during an alarm drains its queue, as it does without the journal. Once
// the database may have lost commits (a failover), the lane waits for the
// read instead, saying why, and restores what was lost once it can read.
func TestALaneGoesOnWithoutTheJournalOnlyFromAVouchedMark(t *testing.T) {
	db, s := &database{}, &stream{}
	evs := events(12)
	first := newLane(db, s)
	applyAll(t, first, evs[:5], 2)
	first.Close()
	if !db.vouched || db.vouches != 1 {
		t.Fatalf("after the first read: vouched %v (%d times), want vouched once", db.vouched, db.vouches)
	}

	// A new replica's lane, during an alarm.
	s.blocked = true
	during := newLane(db, s)
	if _, err := during.ApplyBatch(t.Context(), evs[5:8]); err != nil {
		t.Fatalf("a lane started during an alarm, its mark vouched for: %v", err)
	}
	if db.mark != 8 || !slices.Equal(db.applied, ids(evs[:8])) {
		t.Fatalf("mark %d, applied %v; want 8 and the first eight", db.mark, db.applied)
	}
	during.Close()

	// A failover took the last commit back; the alarm still holds the read.
	db.lose(1)
	after := newLane(db, s)
	defer after.Close()
	_, err := after.ApplyBatch(t.Context(), evs[8:9])
	if err == nil || !strings.Contains(err.Error(), "started again") {
		t.Fatalf("a lane whose database lost commits went on without the journal (%v); want it to wait, saying why", err)
	}
	if !errors.Is(err, event.ErrJournalUnread) {
		t.Errorf("the lane's error %q is not an event.ErrJournalUnread: the service would consume again before the journal can be read", err)
	}
	if db.mark != 5 {
		t.Fatalf("mark %d while the lane waits, want 5", db.mark)
	}
	// The alarm passes: the read restores the lost commit's events first.
	s.blocked = false
	if _, err := after.ApplyBatch(t.Context(), evs[8:9]); err != nil {
		t.Fatal(err)
	}
	if db.mark != 9 || !slices.Equal(db.applied, ids(evs[:9])) {
		t.Fatalf("mark %d, applied %v; want 9 and the first nine in order", db.mark, db.applied)
	}
	if !db.vouched {
		t.Error("the read after the loss did not vouch for the mark")
	}
}

// A lane whose read cannot begin does not go on from a mark that moved
// between its own look at it and the database's vouch, though the
// database vouches for the moved one: another reader of the queue moved
// it (a replica it handed over to), and what that reader applied is not
// what this lane's restore judged. It waits for the read, saying why, and
// goes on once it can read.
func TestALaneDoesNotGoOnWithoutTheJournalFromAMarkThatMovedMeanwhile(t *testing.T) {
	db, s := &database{}, &stream{}
	evs := events(8)
	first := newLane(db, s)
	applyAll(t, first, evs[:4], 2)
	first.Close()

	s.blocked = true
	other := newLane(db, s) // the replica that holds the queue meanwhile, synced at 4
	other.prev, other.synced = 4, true
	defer other.Close()
	db.vouching = func() {
		if _, err := other.ApplyBatch(t.Context(), evs[4:5]); err != nil {
			t.Errorf("the other reader's commit: %v", err)
		}
	}
	during := newLane(db, s)
	defer during.Close()
	_, err := during.ApplyBatch(t.Context(), evs[5:6])
	if err == nil || !strings.Contains(err.Error(), "moved meanwhile") {
		t.Fatalf("a lane whose mark moved while its read could not begin: %v; want it to wait, saying the mark moved", err)
	}
	if db.mark != 5 || !slices.Equal(db.applied, ids(evs[:5])) {
		t.Fatalf("mark %d, applied %v; want 5 and the first five", db.mark, db.applied)
	}
	s.blocked = false
	if _, err := during.ApplyBatch(t.Context(), evs[5:6]); err != nil {
		t.Fatal(err)
	}
	if db.mark != 6 || !slices.Equal(db.applied, ids(evs[:6])) {
		t.Fatalf("mark %d, applied %v; want 6 and the first six in order", db.mark, db.applied)
	}
}

// A lane that cannot go on says why in errors the service can tell
// apart (observe names the queue's reason from them): a read that cannot
// begin (event.ErrJournalUnread), and with it a database that does not
// vouch for the mark (ErrUnvouched); a restore that did not end for
// another cause (ErrRestore alone: a stream that does not answer, a
// database that refuses what it applies again); a journal that does not reach back (a
// *ShortError). Each is an ErrRestore: the lane's restore did not end.
func TestALaneHeldByItsRestoreSaysWhy(t *testing.T) {
	down := errors.New("the database is down")
	for _, c := range []struct {
		name              string
		fault             func(*database, *stream)
		unread, unvouched bool
		short             bool
		database          error
	}{
		{"the read cannot begin, the database lost a commit", func(db *database, s *stream) { db.lose(1); s.blocked = true }, true, true, false, nil},
		{"the stream does not answer", func(db *database, s *stream) { db.lose(1); s.stuck = true }, false, false, false, nil},
		{"the database fails the restore", func(db *database, s *stream) { db.lose(1); db.refuse = map[string]error{"ev-004": down} }, false, false, false, down},
		{"the journal does not reach back", func(db *database, s *stream) { db.lose(3); s.trim(3) }, false, false, true, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			db, s := &database{}, &stream{}
			evs := events(6)
			l := newLane(db, s)
			defer l.Close()
			applyAll(t, l, evs[:5], 1)
			c.fault(db, s)
			_, err := l.ApplyBatch(t.Context(), evs[5:])
			var short *ShortError
			switch {
			case err == nil:
				t.Fatal("the lane went on")
			case !errors.Is(err, ErrRestore):
				t.Errorf("%v: not an ErrRestore", err)
			case errors.Is(err, event.ErrJournalUnread) != c.unread:
				t.Errorf("%v: an event.ErrJournalUnread %v, want %v", err, !c.unread, c.unread)
			case errors.Is(err, ErrUnvouched) != c.unvouched:
				t.Errorf("%v: an ErrUnvouched %v, want %v", err, !c.unvouched, c.unvouched)
			case errors.As(err, &short) != c.short:
				t.Errorf("%v: a *ShortError %v, want %v", err, !c.short, c.short)
			case c.database != nil && !errors.Is(err, c.database):
				t.Errorf("%v: does not wrap the database's error", err)
			}
		})
	}
}
