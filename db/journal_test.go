package db

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

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
	if err := l.Vouch(t.Context(), queue, 0, time.Now()); err != nil { // a read of the journal found none of the queue
		t.Fatal(err)
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

	// Moved on only once a read of the journal vouched for the mark
	// (TestAMarkMovesOnlyWhileVouchedForInThisDatabase).
	if err := l.Vouch(t.Context(), queue, 1, time.Now()); err != nil {
		t.Fatal(err)
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

// The journal's spill keeps a queue's messages, hands them back oldest
// first and says which entries it keeps, takes one kept twice once, and
// deletes them up to a sequence; the body comes back byte for byte. It keeps only
// what the database holds the commits of: messages above the queue's mark
// (a failover took their commits back) are refused, and nothing is kept.
func TestJournalSpillKeepsAQueuesMessagesInOrder(t *testing.T) {
	in := NewInbox(testDB(t, 4))
	queue, other := "q-'\\"+newID(), "q-"+newID()
	above := []event.Spilled{{First: 1, Last: 1, Entries: 1, Body: []byte("{}")}}
	if err := in.Spill(t.Context(), queue, above); err == nil {
		t.Fatal("kept a message of a queue the database holds no mark of")
	}
	for _, q := range []string{queue, other} {
		in.db.MustExec(`INSERT INTO journal_mark (queue, seq) VALUES ($1, 8)`, q)
	}
	above = []event.Spilled{{First: 9, Last: 9, Entries: 1, Body: []byte("{}")}}
	if err := in.Spill(t.Context(), queue, above); err == nil || !strings.Contains(err.Error(), "does not hold their commits") {
		t.Fatalf("kept a message above the mark: %v", err)
	}
	if runs, err := in.Kept(t.Context(), queue); len(runs) != 0 || err != nil {
		t.Fatalf("entries kept above the mark: %v (%v), want none", runs, err)
	}
	body := func(n int) []byte { return []byte(strings.Repeat("\x00'\\x", n)) }
	msgs := []event.Spilled{{First: 5, Last: 7, Entries: 3, Body: body(1)}, {First: 8, Last: 8, Entries: 1, Body: body(2)}}
	for _, s := range []struct {
		q    string
		msgs []event.Spilled
	}{{queue, msgs[1:]}, {queue, msgs}, {other, msgs[:1]}} {
		if err := in.Spill(t.Context(), s.q, s.msgs); err != nil {
			t.Fatal(err)
		}
	}
	got, err := in.Spilled(t.Context(), queue, 10)
	if err != nil || len(got) != 2 || got[0].First != 5 || got[1].Last != 8 || string(got[1].Body) != string(body(2)) {
		t.Fatalf("kept %+v, %v; want 5-7 then 8, as written", got, err)
	}
	if runs, err := in.Kept(t.Context(), queue); spans(runs) != "5-8" || err != nil {
		t.Fatalf("kept %v (%v), want 5-8", runs, err)
	}
	if err := in.Unspill(t.Context(), queue, 7); err != nil {
		t.Fatal(err)
	}
	if got, _ := in.Spilled(t.Context(), queue, 10); len(got) != 1 || got[0].First != 8 {
		t.Fatalf("after deleting up to 7: %+v, want 8 alone", got)
	}
	if runs, _ := in.Kept(t.Context(), other); spans(runs) != "5-7" {
		t.Fatalf("the other queue's kept entries: %v, want 5-7", runs)
	}
}

// Kept says which entries a queue's kept messages hold, as runs of
// consecutive sequences, each with when its first message was kept:
// messages that follow each other or overlap make one run, a gap begins
// another; other queues' messages are no part of it. Mark reads the queue's journal mark, 0 for a queue never marked:
// the journal's writer compares it with kept entries that are gone.
func TestJournalSpillSaysWhichEntriesItKeepsAndTheMark(t *testing.T) {
	in := NewInbox(testDB(t, 4))
	queue, other := "q-'\\"+newID(), "q-"+newID()
	if seq, err := in.Mark(t.Context(), queue); seq != 0 || err != nil {
		t.Fatalf("the mark of a queue never marked: %d (%v), want 0", seq, err)
	}
	for q, seq := range map[string]int{queue: 40, other: 7} {
		in.db.MustExec(`INSERT INTO journal_mark (queue, seq) VALUES ($1, $2)`, q, seq)
	}
	if seq, err := in.Mark(t.Context(), queue); seq != 40 || err != nil {
		t.Fatalf("the mark: %d (%v), want 40", seq, err)
	}
	msg := func(first, last int64) event.Spilled {
		return event.Spilled{First: first, Last: last, Entries: int(last - first + 1), Body: []byte("[]")}
	}
	for _, s := range []struct {
		q    string
		msgs []event.Spilled
	}{
		// Out of order, over several calls: 3-4 5 6-9 | 12-13 | 20-22 21-25 26.
		{queue, []event.Spilled{msg(12, 13), msg(3, 4)}},
		{queue, []event.Spilled{msg(5, 5), msg(6, 9)}},
		{queue, []event.Spilled{msg(20, 22), msg(21, 25), msg(26, 26)}},
		{other, []event.Spilled{msg(1, 2), msg(4, 4)}},
	} {
		if err := in.Spill(t.Context(), s.q, s.msgs); err != nil {
			t.Fatal(err)
		}
	}
	runs, err := in.Kept(t.Context(), queue)
	if spans(runs) != "3-9 12-13 20-26" || err != nil {
		t.Fatalf("kept %v (%v), want 3-9, 12-13 and 20-26", runs, err)
	}
	// 3-9's first message, 3-4, was kept in the first statement, with
	// 12-13, and before 5-9.
	if runs[0].At.IsZero() || !runs[0].At.Equal(runs[1].At) || !runs[2].At.After(runs[0].At) {
		t.Errorf("kept at %v, %v, %v: want the first two at once, the third after", runs[0].At, runs[1].At, runs[2].At)
	}
	if runs, err := in.Kept(t.Context(), other); spans(runs) != "1-2 4" || err != nil {
		t.Fatalf("the other queue kept %v (%v), want 1-2 and 4", runs, err)
	}
	if err := in.Unspill(t.Context(), queue, 13); err != nil {
		t.Fatal(err)
	}
	if runs, err := in.Kept(t.Context(), queue); spans(runs) != "20-26" || err != nil {
		t.Fatalf("after deleting up to 13: kept %v (%v), want 20-26", runs, err)
	}
}

// spans writes runs as "3-9 12-13 20".
func spans(runs []event.KeptRun) string {
	var out []string
	for _, r := range runs {
		if r.First == r.Last {
			out = append(out, strconv.FormatInt(r.First, 10))
		} else {
			out = append(out, fmt.Sprintf("%d-%d", r.First, r.Last))
		}
	}
	return strings.Join(out, " ")
}

// A dead letter parked with the journal's mark is in the outbox and the
// mark moved, both in one round trip; from a mark the database does not
// hold it fails with ErrJournalGap and parks nothing.
func TestAParkedLetterMovesTheJournalMark(t *testing.T) {
	in := NewInbox(testDB(t, 4))
	l := in.Lane(0).(*lane)
	defer l.Close()
	queue := "q-" + newID()
	id := newID()
	letter := event.OutboxLetter{EventID: id, EventType: "TransferCreated", Class: "poison", Reason: "it's bad",
		RoutingKey: "acc_x", Body: []byte("{\x00"), Headers: []byte(`{"h":"v"}`), Queue: queue, MessageID: "m-1"}
	if err := l.Vouch(t.Context(), queue, 0, time.Now()); err != nil { // a read of the journal found none of the queue
		t.Fatal(err)
	}
	if err := l.ParkMarked(t.Context(), letter, event.Mark{Queue: queue, Prev: 0, Last: 1}); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Reason  string  `db:"reason"`
		Body    []byte  `db:"body"`
		Headers *string `db:"headers"`
		Message *string `db:"message_id"`
		Type    *string `db:"content_type"`
	}
	if err := in.db.Get(&got, `SELECT reason, body, headers::text, message_id, content_type FROM dead_letter_outbox WHERE event_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if got.Reason != "it's bad" || string(got.Body) != "{\x00" || got.Headers == nil || *got.Headers != `{"h": "v"}` ||
		got.Message == nil || *got.Message != "m-1" || got.Type != nil {
		t.Fatalf("parked %+v", got)
	}
	if seq, _, err := l.Marked(t.Context(), queue); err != nil || seq != 1 {
		t.Fatalf("mark %d (%v), want 1", seq, err)
	}
	letter.EventID = newID()
	if err := l.ParkMarked(t.Context(), letter, event.Mark{Queue: queue, Prev: 5, Last: 6}); !errors.Is(err, event.ErrJournalGap) {
		t.Fatalf("from a mark the database does not hold: %v, want ErrJournalGap", err)
	}
	var n int
	if err := in.db.Get(&n, `SELECT count(*) FROM dead_letter_outbox WHERE event_id = $1`, letter.EventID); err != nil || n != 0 {
		t.Fatalf("the gap's park left %d letters (%v)", n, err)
	}
}

// The mark's time is where a read of the journal starts. An attempt's
// move sets it to the commit's; a restore's move (Restore: entries the
// journal holds already, written before) keeps it, so that a restore cut
// short still reaches the rest from the moved mark. A queue's first row
// made by a restore has no time, as a queue with no row.
func TestARestoresMoveKeepsTheMarksTime(t *testing.T) {
	in := NewInbox(testDB(t, 4))
	l := in.Lane(0).(*lane)
	defer l.Close()
	ctx := t.Context()
	queue := "q-" + newID()
	ev := func() event.Event {
		return newEvent(t, newID(), "TransferCreated", newID(), "acc-"+queue, "acc-b-"+queue, 5)
	}
	move := func(evs []event.Event, m event.Mark) (int64, time.Time) {
		t.Helper()
		m.Queue = queue
		if _, err := l.ApplyMarked(ctx, evs, m); err != nil {
			t.Fatal(err)
		}
		seq, at, err := l.Marked(ctx, queue)
		if err != nil {
			t.Fatal(err)
		}
		return seq, at
	}
	if err := l.Vouch(ctx, queue, 0, time.Now()); err != nil { // a read of the journal found none of the queue
		t.Fatal(err)
	}
	move([]event.Event{ev()}, event.Mark{Prev: 0, Last: 2})
	if _, err := in.db.Exec(`UPDATE journal_mark SET at = now() - interval '1 hour' WHERE queue = $1`, queue); err != nil {
		t.Fatal(err)
	}
	_, old, err := l.Marked(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		evs  []event.Event
		m    event.Mark
	}{
		{"a restore's move alone", nil, event.Mark{Prev: 2, Last: 5, Restore: true}},
		{"a restore's events", []event.Event{ev()}, event.Mark{Prev: 5, Last: 6, Restore: true}},
		{"a restore's batch", []event.Event{ev(), ev()}, event.Mark{Prev: 6, Last: 8, Restore: true}},
	} {
		if seq, at := move(tt.evs, tt.m); seq != tt.m.Last || !at.Equal(old) {
			t.Errorf("%s: mark %d at %s, want %d at %s, the time it had", tt.name, seq, at, tt.m.Last, old)
		}
	}
	if err := l.Vouch(ctx, queue, 8, old); err != nil { // the read that synced the restored queue
		t.Fatal(err)
	}
	if seq, at := move([]event.Event{ev()}, event.Mark{Prev: 8, Last: 9}); seq != 9 || !at.After(old.Add(time.Minute)) {
		t.Errorf("an attempt's move: mark %d at %s, want 9 at the commit's time, not %s", seq, at, old)
	}
	fresh := queue + "-restored"
	if _, err := l.ApplyMarked(ctx, nil, event.Mark{Queue: fresh, Prev: 0, Last: 4, Restore: true}); err != nil {
		t.Fatal(err)
	}
	if seq, at, err := l.Marked(ctx, fresh); err != nil || seq != 4 || !at.IsZero() {
		t.Errorf("a queue's first row, made by a restore: mark %d at %v (%v), want 4 and no time", seq, at, err)
	}
}

// A restore's letter (ParkMarked with Restore: a letter the lost commit
// had parked, or an entry the database refuses, or that no longer
// decodes, when applied again) moves the mark as a restore's move does:
// its time stays, and no read need have vouched for it. And the letter and
// the move are one transaction, so that a restore cut short between them
// never writes the letter twice: a move that fails (a gap) parks nothing,
// and a letter the outbox refuses leaves the mark where it was.
func TestARestoresLetterMovesTheMarkInItsTransactionAndKeepsItsTime(t *testing.T) {
	in := NewInbox(testDB(t, 4))
	l := in.Lane(0).(*lane)
	defer l.Close()
	ctx := t.Context()
	queue := "q-" + newID()
	ev := newEvent(t, newID(), "TransferCreated", newID(), "acc-"+queue, "acc-b-"+queue, 5)
	if err := l.Vouch(ctx, queue, 0, time.Now()); err != nil { // a read of the journal found none of the queue
		t.Fatal(err)
	}
	if _, err := l.ApplyMarked(ctx, []event.Event{ev}, event.Mark{Queue: queue, Prev: 0, Last: 2}); err != nil {
		t.Fatal(err)
	}
	// An hour back, its row written again (so not vouched for, as after a
	// restore).
	if _, err := in.db.Exec(`UPDATE journal_mark SET at = now() - interval '1 hour' WHERE queue = $1`, queue); err != nil {
		t.Fatal(err)
	}
	_, old, err := l.Marked(ctx, queue)
	if err != nil {
		t.Fatal(err)
	}
	letter := func(reason string) event.OutboxLetter {
		return event.OutboxLetter{EventID: newID(), EventType: "TransferCreated", Class: "poison", Reason: reason,
			RoutingKey: "acc_x", Body: []byte(`{}`), Queue: queue}
	}
	letters := func(lt event.OutboxLetter) int {
		t.Helper()
		var n int
		if err := in.db.Get(&n, `SELECT count(*) FROM dead_letter_outbox WHERE event_id = $1`, lt.EventID); err != nil {
			t.Fatal(err)
		}
		return n
	}
	mark := func() (int64, time.Time) {
		t.Helper()
		seq, at, err := l.Marked(ctx, queue)
		if err != nil {
			t.Fatal(err)
		}
		return seq, at
	}

	parked := letter("applied and acked once, then no longer decodes")
	if err := l.ParkMarked(ctx, parked, event.Mark{Queue: queue, Prev: 2, Last: 3, Restore: true}); err != nil {
		t.Fatalf("a restore's letter, the mark not vouched for: %v", err)
	}
	if seq, at := mark(); seq != 3 || !at.Equal(old) || letters(parked) != 1 {
		t.Fatalf("mark %d at %s, %d letters; want 3 at %s, the time it had, and the letter", seq, at, letters(parked), old)
	}

	gap := letter("from a mark the database does not hold")
	if err := l.ParkMarked(ctx, gap, event.Mark{Queue: queue, Prev: 7, Last: 8, Restore: true}); !errors.Is(err, event.ErrJournalGap) {
		t.Fatalf("from a mark the database does not hold: %v, want ErrJournalGap", err)
	}
	if n := letters(gap); n != 0 {
		t.Fatalf("the move failed and %d letters were parked", n)
	}

	// The outbox refuses a letter after the move ran, in the same statement.
	if _, err := in.db.Exec(`CREATE FUNCTION refuse_letter() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.reason = 'refused' THEN RAISE EXCEPTION 'the outbox refuses it'; END IF; RETURN NEW; END $$;
		CREATE TRIGGER refuse_letter BEFORE INSERT ON dead_letter_outbox FOR EACH ROW EXECUTE FUNCTION refuse_letter()`); err != nil {
		t.Fatal(err)
	}
	refused := letter("refused")
	if err := l.ParkMarked(ctx, refused, event.Mark{Queue: queue, Prev: 3, Last: 4, Restore: true}); err == nil {
		t.Fatal("the outbox refused the letter, and ParkMarked returned no error")
	}
	if seq, at := mark(); seq != 3 || !at.Equal(old) || letters(refused) != 0 {
		t.Fatalf("after a letter the outbox refused: mark %d at %s, %d letters; want the mark where it was (3 at %s), no letter",
			seq, at, letters(refused), old)
	}
}
