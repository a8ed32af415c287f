package db

import (
	"testing"
	"time"

	"transferconsumer/event"
)

// Reading a queue's journal mark is one Query message and its answer, as
// an attempt is: behind PgBouncer in transaction mode, the two exchanges
// of a statement with a parameter may reach two server connections. The
// queue's name, quote and backslash included, is read back as written, and
// a queue never marked answers 0.
func TestMarkedIsOneRoundTrip(t *testing.T) {
	url := testDBURL(t)
	database, d := openCounted(t, url, 4)
	ctx := t.Context()
	l := NewInbox(database).Lane(0).(*lane)
	defer l.Close()
	queue := `q'\` + newID()
	ev := newEvent(t, newID(), event.TransferCreated, newID(), "acc_u", "acc_v", 1)
	if err := l.Vouch(ctx, queue, 0, time.Now()); err != nil { // a read of the journal found none of the queue
		t.Fatal(err)
	}
	if _, err := l.ApplyMarked(ctx, []event.Event{ev}, event.Mark{Queue: queue, Prev: 0, Last: 3}); err != nil {
		t.Fatal(err)
	}
	// The lane keeps its connection: the pool opens another for the read,
	// and the reads below find it idle.
	if _, _, err := l.Marked(ctx, queue); err != nil {
		t.Fatal(err)
	}

	before := d.writes.Load()
	seq, at, err := l.Marked(ctx, queue)
	if n := d.writes.Load() - before; n != 1 {
		t.Errorf("reading a mark took %d writes, want one", n)
	}
	if err != nil || seq != 3 || at.IsZero() {
		t.Errorf("the mark of %q: %d at %v (%v), want 3 and when it moved", queue, seq, at, err)
	}

	before = d.writes.Load()
	seq, at, err = l.Marked(ctx, "q-"+newID())
	if n := d.writes.Load() - before; n != 1 {
		t.Errorf("reading a queue never marked took %d writes, want one", n)
	}
	if err != nil || seq != 0 || at != (time.Time{}) {
		t.Errorf("a queue never marked: %d at %v (%v), want 0, the zero time and no error", seq, at, err)
	}
}
