package db

import (
	"errors"
	"testing"

	"transferconsumer/event"
)

// A marked attempt moves its queue's journal mark in its own transaction:
// from 0 for a queue never marked, then only from the sequence the
// database holds. An attempt that goes on from another sequence (the
// database lost commits, or another consumer moved the mark) fails with
// ErrJournalGap and applies nothing; a transaction that fails for its
// events moves no mark.
func TestJournalMarkMovesWithItsTransaction(t *testing.T) {
	in := NewInbox(testDB(t, 4))
	l := in.Lane(0).(*lane)
	defer l.Close()
	queue := "q-" + newID()
	ev := func() event.Event {
		return newEvent(t, newID(), "TransferCreated", newID(), "acc-"+queue, "acc-b-"+queue, 5)
	}
	mark := func() int64 {
		t.Helper()
		seq, _, err := l.Marked(t.Context(), queue)
		if err != nil {
			t.Fatal(err)
		}
		return seq
	}
	if got := mark(); got != 0 {
		t.Fatalf("new queue's mark %d, want 0", got)
	}
	first := ev()
	if outs, err := l.ApplyMarked(t.Context(), []event.Event{first}, event.Mark{Queue: queue, Prev: 0, Last: 1}); err != nil || len(outs) != 1 || outs[0].Err != nil {
		t.Fatalf("first event: %v %v", outs, err)
	}
	if got := mark(); got != 1 {
		t.Fatalf("mark %d after the first event, want 1", got)
	}

	lost := ev()
	_, err := l.ApplyMarked(t.Context(), []event.Event{lost}, event.Mark{Queue: queue, Prev: 7, Last: 8})
	if !errors.Is(err, event.ErrJournalGap) || event.ClassOf(t.Context(), err) != event.ClassTransient {
		t.Fatalf("an attempt from a mark the database does not hold: %v, want a transient ErrJournalGap", err)
	}
	var n int
	if err := in.db.Get(&n, `SELECT count(*) FROM processed_event WHERE event_id = $1`, lost.ID); err != nil || n != 0 {
		t.Fatalf("the gap's attempt applied its event (%d rows, %v)", n, err)
	}

	batch := []event.Event{ev(), ev(), first}
	outs, err := l.ApplyMarked(t.Context(), batch, event.Mark{Queue: queue, Prev: 1, Last: 4})
	if err != nil || len(outs) != 3 || !outs[2].Duplicate {
		t.Fatalf("batch: %v %v, want three outcomes, the last a duplicate", outs, err)
	}
	if got := mark(); got != 4 {
		t.Fatalf("mark %d after the batch, want 4", got)
	}

	// A completion whose amount contradicts its transfer's: refused.
	bad := newEvent(t, newID(), "TransferCompleted", first.Transfer.ID, first.Transfer.FromAccount, first.Transfer.ToAccount, 6)
	if _, err := l.ApplyMarked(t.Context(), []event.Event{bad}, event.Mark{Queue: queue, Prev: 4, Last: 5}); err == nil {
		t.Fatalf("a refused event was applied")
	}
	if got := mark(); got != 4 {
		t.Fatalf("mark %d after a failed transaction, want 4", got)
	}
	if _, err := l.ApplyMarked(t.Context(), nil, event.Mark{Queue: queue, Prev: 4, Last: 9}); err != nil {
		t.Fatalf("moving the mark alone: %v", err)
	}
	if got := mark(); got != 9 {
		t.Fatalf("mark %d, want 9", got)
	}
}
