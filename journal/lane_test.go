package journal

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/event"
)

// Each committed event is journaled with the sequence its transaction
// moved the mark to; after the database takes back its last commits, the
// next attempt finds the gap, the lost events are applied again first, in
// their order, and the attempt goes on: the database ends with every
// event once, in the order they were acked.
func TestALostCommitIsAppliedAgainInOrder(t *testing.T) {
	for _, batch := range []int{1, 3} {
		t.Run(fmt.Sprintf("batch %d", batch), func(t *testing.T) {
			db, s := &database{}, &stream{}
			l := newLane(db, s)
			evs := events(12)
			applyAll(t, l, evs[:9], batch)
			if db.mark != 9 || len(s.entries) != 9 || s.entries[8].Seq != 9 {
				t.Fatalf("mark %d, %d entries: want 9 of each", db.mark, len(s.entries))
			}
			db.lose(2)
			applyAll(t, l, evs[9:], batch)
			want := ids(evs)
			if !slices.Equal(db.applied, want) {
				t.Fatalf("applied %v, want %v", db.applied, want)
			}
			if db.mark != 12 {
				t.Errorf("mark %d, want 12", db.mark)
			}
		})
	}
}

// An event dead-lettered in its transaction (a producer conflict) keeps
// its sequence in the journal, marked, and is never applied again: the
// restore moves the mark over it. An event whose transaction the database
// refused takes no sequence and writes no entry.
func TestADeadLetteredEntryIsNeverAppliedAgain(t *testing.T) {
	db := &database{conflic: map[string]bool{"ev-001": true}, refuse: map[string]error{"ev-002": event.Transition(errors.New("no"))}}
	st := &stream{}
	l := newLane(db, st)
	evs := events(4)
	for _, ev := range evs {
		_, _ = applyBatch(t, l, []event.Event{ev})
	}
	var seqs []int64
	for _, e := range st.entries {
		seqs = append(seqs, e.Seq)
		if e.Dead != (e.Event.ID == "ev-001") {
			t.Errorf("entry %d (%s) dead-lettered: %v", e.Seq, e.Event.ID, e.Dead)
		}
	}
	if !slices.Equal(seqs, []int64{1, 2, 3}) {
		t.Fatalf("entries %v, want 1 2 3 (the refused event takes none)", seqs)
	}
	db.lose(3)
	db.conflic = nil // were it applied again, it would now apply
	if _, err := l.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(db.applied, []string{"ev-000", "ev-003"}) || db.mark != 3 {
		t.Fatalf("applied %v, mark %d; want ev-000 ev-003, mark 3", db.applied, db.mark)
	}
}

// The lane returns once a transaction committed, and the worker's ack
// waits for Journaled. While the stream refuses the entries, Journaled
// stays open, and the next transaction's entries wait behind: the write is
// tried again with the same entries under the same sequences, and once
// the stream takes them, every entry is there once, in the order of the
// commits.
func TestEntriesTheStreamRefusedAreWrittenAgainBeforeTheAck(t *testing.T) {
	db, s := &database{}, &stream{}
	var mu sync.Mutex
	var stalls []string // what the lane said: "stalled <event> <tries>" and "healed"
	l := newLaneWith(db, s, Config{Reports: Reports{
		Stalled: func(q string, _ time.Time, attempts int, eventID string, _ error) {
			mu.Lock()
			defer mu.Unlock()
			stalls = append(stalls, fmt.Sprintf("stalled %s %d", eventID, attempts))
		},
		Healed: func(string) {
			mu.Lock()
			defer mu.Unlock()
			stalls = append(stalls, "healed")
		}}})
	defer l.Close()
	applyAll(t, l, events(1), 1) // the first read of the stream
	s.refuse(errors.New("stream down"))
	evs := events(4)
	for _, b := range [][]event.Event{evs[1:3], evs[3:]} {
		if _, err := l.ApplyBatch(t.Context(), b); err != nil {
			t.Fatal(err)
		}
	}
	journaled := l.Journaled()
	if journaled == nil {
		t.Fatal("journaled while the stream refuses every write")
	}
	for deadline := time.Now().Add(time.Minute); s.refusals() < 2; {
		if time.Now().After(deadline) {
			t.Fatal("the refused write was not tried again within a minute")
		}
		runtime.Gosched()
	}
	select {
	case <-journaled:
		t.Fatal("journaled while the stream refuses every write")
	default:
	}
	s.refuse(nil)
	waitJournaled(t, l)
	var seqs []int64
	for _, e := range s.entries {
		seqs = append(seqs, e.Seq)
	}
	if !slices.Equal(seqs, []int64{1, 2, 3, 4}) || !slices.Equal(db.applied, ids(evs)) {
		t.Fatalf("entries %v, applied %v; want 1 2 3 4, each event once", seqs, db.applied)
	}
	mu.Lock()
	defer mu.Unlock()
	n := len(stalls)
	if n < 3 || stalls[0] != "stalled ev-001 1" || stalls[1] != "stalled ev-001 2" || stalls[n-1] != "healed" {
		t.Errorf("the lane said %v; want it stalled at ev-001 on each refused write, then healed", stalls)
	}
}

// The journal is read when the lane starts and when the database lacks
// the mark the lane went on from, and at no other failure: a failure of
// the environment that took nothing back (a refused connection, a
// deadlock) is retried without reading the stream.
func TestTheJournalIsReadOnlyWhenTheDatabaseLacksTheMark(t *testing.T) {
	db, s := &database{}, &stream{}
	l := newLane(db, s)
	applyAll(t, l, events(3), 1)
	if s.reads != 1 {
		t.Fatalf("%d reads to start, want 1", s.reads)
	}
	db.down = errors.New("connection refused")
	for range 3 {
		if _, err := applyBatch(t, l, events(4)[3:]); err == nil {
			t.Fatal("applied with the database down")
		}
	}
	db.down = nil
	applyAll(t, l, events(4)[3:], 1)
	if s.reads != 1 {
		t.Fatalf("%d reads after failures that took nothing back, want still 1", s.reads)
	}
	db.lose(2)
	applyAll(t, l, events(5)[4:], 1)
	if s.reads != 2 {
		t.Errorf("%d reads after the database lost commits, want 2", s.reads)
	}
	if !slices.Equal(db.applied, []string{"ev-000", "ev-001", "ev-002", "ev-003", "ev-004"}) {
		t.Errorf("applied %v", db.applied)
	}
}

// When the journal begins after the database's mark moved and its first
// entry of the queue is past the next one, Recover reports how many
// events at most it cannot restore, and the lane applies nothing; once the
// loss is accepted, the rest is restored.
func TestAJournalThatDoesNotReachBackHoldsTheQueue(t *testing.T) {
	db, s := &database{}, &stream{}
	l := newLane(db, s)
	evs := events(10)
	applyAll(t, l, evs, 1)
	db.lose(6) // the database holds up to entry 4
	s.trim(7)  // the journal from entry 8
	_, err := applyBatch(t, l, events(11)[10:])
	var short *ShortError
	if !errors.As(err, &short) || short.Missing() != 3 || short.Mark != 4 || short.First != 8 {
		t.Fatalf("%v, want a ShortError of 3 events (5 to 7)", err)
	}
	reads := s.reads
	for range 3 { // the worker's retries while the queue waits
		if _, err := applyBatch(t, l, events(11)[10:]); !errors.As(err, &short) {
			t.Fatalf("retry: %v, want the ShortError again", err)
		}
	}
	if s.reads != reads {
		t.Errorf("the retries read the stream %d times; while the mark stays, none should", s.reads-reads)
	}
	if len(db.applied) != 4 {
		t.Fatalf("applied %v while the queue waited", db.applied)
	}
	if err := l.AcceptLoss(t.Context(), short); err != nil {
		t.Fatal(err)
	}
	if n, err := l.Recover(t.Context()); err != nil || n != 3 {
		t.Fatalf("recover after accepting the loss: %d, %v; want 3 entries", n, err)
	}
	want := []string{"ev-000", "ev-001", "ev-002", "ev-003", "ev-007", "ev-008", "ev-009"}
	if !slices.Equal(db.applied, want) {
		t.Errorf("applied %v, want %v", db.applied, want)
	}
}

// A transaction's entries travel in one message per queue (more for a
// body past maxMessage), and come back as they went: sequence, the
// dead-lettered mark, and the delivery the event came in.
func TestEntriesComeBackAsTheyWent(t *testing.T) {
	body := []byte(`{"eventId":"6f1c3c9e-9d1e-4c53-9a55-7b1f2c3d4e5f","eventType":"TransferCreated","occurredAt":"2026-07-10T12:00:00Z",` +
		`"data":{"transferId":"0b7d8c2e-1a3f-4e5d-8c9b-2a1f3e4d5c6b","fromAccount":"a","toAccount":"b","amountMinor":5,"currency":"EUR"}}`)
	const id = "6f1c3c9e-9d1e-4c53-9a55-7b1f2c3d4e5f"
	ev, err := event.Decode(body, id, "TransferCreated")
	if err != nil {
		t.Fatal(err)
	}
	ev.Message = event.Message{RoutingKey: "a", Body: body, MessageID: id, ContentType: "application/json",
		Headers: amqp.Table{"x-producer": "payments", "n": int64(3)}}
	entries := []Entry{{Queue: "q.0", Seq: 7, Event: ev}, {Queue: "q.0", Seq: 8, Event: ev, Dead: true}}
	msgs, err := encode(entries)
	if err != nil {
		t.Fatal(err)
	}
	p := publishing("q.0", msgs[0], time.Now())
	if len(msgs) != 1 || msgs[0].Entries != 2 || p.Headers[hQueue] != "q.0" || p.Headers[hFirst] != int64(7) || p.Headers[hLast] != int64(8) {
		t.Fatalf("%d messages, the first's headers %v; want 1, of q.0's 7 to 8", len(msgs), p.Headers)
	}
	back, err := decode("q.0", msgs[0].Body)
	if err != nil {
		t.Fatal(err)
	}
	if len(back) != 2 || back[0].Seq != 7 || back[0].Dead || back[1].Seq != 8 || !back[1].Dead {
		t.Fatalf("%+v", back)
	}
	got := back[0].Event
	if got.ID != ev.ID || string(got.Fingerprint) != string(ev.Fingerprint) || string(got.Message.Body) != string(body) ||
		got.Message.RoutingKey != "a" || got.Message.MessageID != id || got.Message.Headers["x-producer"] != "payments" {
		t.Errorf("came back as %+v", got)
	}

	var big []Entry
	for i := range 3 * maxMessage / len(body) {
		big = append(big, Entry{Queue: "q.0", Seq: int64(i + 1), Event: ev})
	}
	msgs, err = encode(big)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range msgs {
		if len(m.Body) > maxMessage {
			t.Errorf("a message of %d bytes", len(m.Body))
		}
		var w []json.RawMessage
		if err := json.Unmarshal(m.Body, &w); err != nil {
			t.Fatal(err)
		}
		n += len(w)
	}
	if len(msgs) < 2 || n != len(big) {
		t.Errorf("%d entries in %d messages, want %d in several", n, len(msgs), len(big))
	}
}

// Two restores of one queue at once (a replica's and the recover command,
// seen in CI beside the service): the one whose mark the other moved goes
// on from where the other got to, rather than failing or starting again,
// and every lost event is applied once, in order.
func TestTwoRestoresOfOneQueueGoOnTogether(t *testing.T) {
	db, s := &database{}, &stream{}
	applyAll(t, newLane(db, s), events(10), 1)
	db.lose(7)
	a, b := newLane(db, s), newLane(db, s)
	db.before = func() {
		if _, err := b.Recover(t.Context()); err != nil {
			t.Errorf("the other restore: %v", err)
		}
	}
	reads := s.reads
	if _, err := a.Recover(t.Context()); err != nil {
		t.Fatalf("the restore the other overtook: %v", err)
	}
	if s.reads != reads+2 {
		t.Errorf("%d reads of the stream, want one each: none started again", s.reads-reads)
	}
	want := make([]string, 10)
	for i, ev := range events(10) {
		want[i] = ev.ID
	}
	if !slices.Equal(db.applied, want) || db.mark != 10 || a.Mark() != 10 {
		t.Errorf("applied %v, mark %d (lane %d); want each once, in order, mark 10", db.applied, db.mark, a.Mark())
	}
}

// A gap of a single entry is a gap: the database holds up to entry 4 and
// the journal, its retention past, begins at entry 6, so event 5 is in
// neither, and the queue waits, its count said (adr/0014).
func TestAOneEntryGapIsReported(t *testing.T) {
	db, s := &database{}, &stream{}
	l := newLane(db, s)
	applyAll(t, l, events(10), 1)
	db.lose(6) // the database holds up to entry 4
	s.trim(5)  // the journal from entry 6
	_, err := applyBatch(t, l, events(11)[10:])
	var short *ShortError
	if !errors.As(err, &short) || short.Missing() != 1 || short.Mark != 4 || short.First != 6 {
		t.Fatalf("%v, want a ShortError of 1 event (5)", err)
	}
	if len(db.applied) != 4 {
		t.Fatalf("applied %v past the gap", db.applied)
	}
}

// A journal message that no longer parses does not block its queue for
// good: the entries before it are applied, then the queue waits, reported
// as one whose journal does not reach back is, naming the entries that
// message holds, and its retries read nothing while the mark stays; once
// an operator accepts their loss (recover --accept-loss), the rest is
// restored. (An entry that no longer decodes in a message that parses is
// dead-lettered instead: decode_test.go.)
func TestAMessageThatNoLongerParsesIsReportedAndItsLossCanBeAccepted(t *testing.T) {
	db, s := &database{}, &stream{}
	l := newLane(db, s)
	applyAll(t, l, events(6), 1)
	db.lose(4) // the database holds up to entry 2
	s.bad = map[int64]bool{4: true}
	_, err := l.Recover(t.Context())
	var short *ShortError
	if !errors.As(err, &short) || short.Unreadable == nil || short.Mark != 3 || short.First != 5 || short.Missing() != 1 {
		t.Fatalf("%v, want the entry 4 named as not parsing, after entry 3 applied", err)
	}
	reads := s.reads
	if _, err := l.Recover(t.Context()); !errors.As(err, &short) || s.reads != reads {
		t.Fatalf("retry: %v after %d reads; want the same report, without reading", err, s.reads-reads)
	}
	if err := l.AcceptLoss(t.Context(), short); err != nil {
		t.Fatal(err)
	}
	if n, err := l.Recover(t.Context()); err != nil || n != 2 {
		t.Fatalf("recover after accepting the loss: %d, %v; want 2 entries", n, err)
	}
	want := []string{"ev-000", "ev-001", "ev-002", "ev-004", "ev-005"}
	if !slices.Equal(db.applied, want) || db.mark != 6 {
		t.Errorf("applied %v, mark %d; want %v, 6", db.applied, db.mark, want)
	}
}

// A dead letter parked during a broker alarm is journaled: it takes the
// queue's next sequence with the mark, in its own commit, and its entry
// reaches the stream before the ack. A failover that takes the commit back
// takes the letter out of the outbox too; the restore parks it again, as
// it was (class, reason, body that is not JSON, headers), and applies the
// events around it, in order.
func TestAParkedLetterIsJournaledAndParkedAgainAfterALoss(t *testing.T) {
	db, s := &database{}, &stream{}
	l := newLane(db, s)
	evs := events(3)
	applyAll(t, l, evs[:1], 1)
	letter := event.OutboxLetter{EventID: "poison-1", Class: "poison", Reason: "not JSON",
		RoutingKey: "acc_p", Body: []byte(`{"eventId": "x, not json`), Headers: []byte(`{"x-producer":"p"}`)}
	if err := l.Park(t.Context(), letter); err != nil {
		t.Fatal(err)
	}
	waitJournaled(t, l)
	applyAll(t, l, evs[1:], 1)
	if !slices.Equal(db.letters(), []string{"poison-1"}) || db.mark != 4 {
		t.Fatalf("parked %v, mark %d; want the letter with sequence 2, mark 4", db.letters(), db.mark)
	}
	db.lose(3) // the letter's commit and the events after it
	if n, err := l.Recover(t.Context()); err != nil || n != 2 {
		t.Fatalf("%d applied again, %v; want 2", n, err)
	}
	if len(db.outbox) != 1 {
		t.Fatalf("%d letters parked again, want 1", len(db.outbox))
	}
	got := db.outbox[0]
	if got.EventID != "poison-1" || got.Class != "poison" || got.Reason != "not JSON" || string(got.Body) != string(letter.Body) ||
		string(got.Headers) != `{"x-producer":"p"}` || got.RoutingKey != "acc_p" || got.Queue != "q.0" {
		t.Errorf("parked again as %+v", got)
	}
	if !slices.Equal(db.applied, ids(evs)) || db.mark != 4 {
		t.Errorf("applied %v, mark %d; want each event once in order, 4", db.applied, db.mark)
	}
}

// A park that finds the database without the commits the lane went on
// from (a failover) says so, as an apply does, applies the lost events
// again first, and then takes the queue's next sequence: one loop
// (commitNext) serves both, and before it a park restored without a word.
func TestAGapFoundByAnApplyOrAParkIsLoggedAndRestoredFirst(t *testing.T) {
	for _, by := range []string{"apply", "park"} {
		t.Run(by, func(t *testing.T) {
			db, s, log := &database{}, &stream{}, &logged{}
			l := loggedLane(db, s, Config{}, log)
			evs := events(4)
			applyAll(t, l, evs[:3], 1)
			db.lose(2)
			var err error
			if by == "apply" {
				_, err = applyBatch(t, l, evs[3:])
			} else {
				err = l.Park(t.Context(), event.OutboxLetter{EventID: "poison-1", Class: "poison", Reason: "not JSON", Body: []byte("x")})
				waitJournaled(t, l)
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := log.with(slog.LevelWarn, "does not hold the mark the worker went on from"); len(got) != 1 {
				t.Errorf("logged %q of the gap, want one line", got)
			}
			want := ids(evs[:3])
			if by == "apply" {
				want = ids(evs)
			}
			if !slices.Equal(db.applied, want) || db.mark != 4 {
				t.Errorf("applied %v, mark %d; want %v, 4", db.applied, db.mark, want)
			}
			if by == "park" && !slices.Equal(db.letters(), []string{"poison-1"}) {
				t.Errorf("parked %v, want the letter once", db.letters())
			}
		})
	}
}
