package journal

// A restore's dead letters: each is written with the move of the mark past
// its entry, in one transaction (ParkMarked); the models are
// models_test.go's.

import (
	"errors"
	"slices"
	"testing"

	"transferconsumer/event"
)

// A restore cut short between a letter and the move of the mark past its
// entry (here the connection is cut before the commit that moves the
// mark, three times) leaves the letter in the outbox once, whatever the
// retries: the letter and the move are one commit. Before, the letter was
// written in a transaction of its own, then the mark moved in another, and
// each retry wrote it again: four letters in the outbox, so four in the
// dead-letter queue. For a letter parked in the lost commit (parked
// again), an entry the database refuses when applied again, and an entry
// that no longer decodes.
func TestARestoreCutShortAtALetterWritesItOnce(t *testing.T) {
	for _, tt := range []struct {
		name    string
		lost    func(t *testing.T, db *database, s *stream) // the database lacks entries 1 to 4; the letter's is 2
		letter  string
		applied []string
	}{
		{"a letter parked in the lost commit", func(t *testing.T, db *database, s *stream) {
			l, evs := newLane(db, s), events(3)
			applyAll(t, l, evs[:1], 1)
			if err := l.Park(t.Context(), event.OutboxLetter{EventID: "poison-1", Class: "poison", Reason: "not JSON", Body: []byte("x")}); err != nil {
				t.Fatal(err)
			}
			waitJournaled(t, l)
			applyAll(t, l, evs[1:], 1)
			db.lose(4)
		}, "poison-1", []string{"ev-000", "ev-001", "ev-002"}},
		{"an entry refused when applied again", func(t *testing.T, db *database, s *stream) {
			applyAll(t, newLane(db, s), events(4), 1)
			db.lose(4)
			db.refuse = map[string]error{"ev-001": event.Transition(errors.New("no longer allowed"))}
		}, "ev-001", []string{"ev-000", "ev-002", "ev-003"}},
		{"an entry that no longer decodes", func(t *testing.T, db *database, s *stream) {
			s.put("q.0", 1, 4, journalBody(goodEntry(1), badEntry(2), goodEntry(3), goodEntry(4)))
		}, eventID(2), []string{eventID(1), eventID(3), eventID(4)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			db, s := &database{}, &stream{page: 10}
			tt.lost(t, db, s)
			l := newLane(db, s)
			db.cut = map[int64]int{2: 3}
			restored := restoreUntilDone(t, l)
			if got := db.letters(); !slices.Equal(got, []string{tt.letter}) || db.mark != 4 || restored != 4 {
				t.Fatalf("after three restores cut short at the letter's entry and one more: letters %v, mark %d, %d restores; "+
					"want %s's letter once, mark 4, 4 restores", got, db.mark, restored, tt.letter)
			}
			if !slices.Equal(db.applied, tt.applied) {
				t.Errorf("applied %v, want %v", db.applied, tt.applied)
			}
		})
	}
}

// restoreUntilDone restores l's queue until a restore ends without an
// error (as the worker's retries do), ten times at most, and returns how
// many it took.
func restoreUntilDone(t *testing.T, l *Lane) int {
	t.Helper()
	for n := 1; n <= 10; n++ {
		if _, err := l.Recover(t.Context()); err == nil {
			return n
		}
	}
	t.Fatal("ten restores failed")
	return 0
}

// Two restores of one queue at once, the other overtaking this one at its
// letter's entry or just before: the other parks the letter and moves the
// mark past it; this one's ParkMarked then finds the mark moved
// (event.ErrJournalGap), or this one finds the entry below the mark, and
// goes on from where the other got to, as for an event, without parking
// the letter a second time.
func TestARestoreOvertakenAtALetterDoesNotParkItAgain(t *testing.T) {
	for _, at := range []string{"the letter's commit", "the commit before"} {
		t.Run(at, func(t *testing.T) {
			db, s := &database{}, &stream{}
			l := newLane(db, s)
			evs := events(3)
			applyAll(t, l, evs[:1], 1)
			if err := l.Park(t.Context(), event.OutboxLetter{EventID: "poison-1", Class: "poison", Reason: "not JSON", Body: []byte("x")}); err != nil {
				t.Fatal(err)
			}
			waitJournaled(t, l)
			applyAll(t, l, evs[1:], 1)
			db.lose(4)
			a, b := newLane(db, s), newLane(db, s)
			other := func() {
				if _, err := b.Recover(t.Context()); err != nil {
					t.Errorf("the other restore: %v", err)
				}
			}
			db.before = other // at a's first commit, its first event's
			if at == "the letter's commit" {
				db.before = func() { db.before = other } // at the next
			}
			if _, err := a.Recover(t.Context()); err != nil {
				t.Fatalf("the restore the other overtook: %v", err)
			}
			if got := db.letters(); !slices.Equal(got, []string{"poison-1"}) || db.mark != 4 || a.Mark() != 4 {
				t.Errorf("letters %v, mark %d (lane %d); want the letter once, mark 4", got, db.mark, a.Mark())
			}
			if !slices.Equal(db.applied, ids(evs)) {
				t.Errorf("applied %v, want each once, in order", db.applied)
			}
		})
	}
}
