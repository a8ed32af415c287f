package journal

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/event"
)

// database is a model of the database's side of a lane: the events it
// applied, in order, and each queue's mark, moved as journal_advance moves
// it. lose takes back its last commits, as a failover to a standby behind
// or a restore does.
type database struct {
	applied []string // event ids, in the order applied
	mark    int64
	at      time.Time
	commits []commit // to take back
	refuse  map[string]error
	conflic map[string]bool // answered as a producer conflict, committed
	down    error
	before  func() // runs once, at the next ApplyMarked
	txs     int    // transactions that applied events
}

type commit struct {
	mark    int64
	at      time.Time
	applied int
}

func (d *database) lose(n int) {
	c := d.commits[len(d.commits)-n]
	d.commits = d.commits[:len(d.commits)-n]
	d.mark, d.at, d.applied = c.mark, c.at, d.applied[:c.applied]
}

type modelLane struct{ db *database }

func (l modelLane) Apply(ctx context.Context, ev event.Event) (event.Result, error) {
	panic("the journal's lane applies through ApplyMarked")
}

func (l modelLane) Close() {}

func (l modelLane) Marked(context.Context, string) (int64, time.Time, error) {
	if l.db.down != nil {
		return 0, time.Time{}, l.db.down
	}
	return l.db.mark, l.db.at, nil
}

func (l modelLane) ApplyMarked(_ context.Context, evs []event.Event, m event.Mark) ([]event.Outcome, error) {
	d := l.db
	if f := d.before; f != nil {
		d.before = nil
		f()
	}
	if d.down != nil {
		return nil, event.Transient(d.down)
	}
	if d.mark != m.Prev {
		return nil, event.Transient(fmt.Errorf("%w: holds %d, went on from %d", event.ErrJournalGap, d.mark, m.Prev))
	}
	outs := make([]event.Outcome, len(evs))
	for _, ev := range evs {
		if err := d.refuse[ev.ID]; err != nil {
			return nil, err
		}
	}
	d.commits = append(d.commits, commit{d.mark, d.at, len(d.applied)})
	if len(evs) > 0 {
		d.txs++
	}
	for i, ev := range evs {
		switch {
		case d.conflic[ev.ID]:
			outs[i].Err = event.Conflict(errors.New("conflict"))
		case slices.Contains(d.applied, ev.ID):
			outs[i].Duplicate = true
		default:
			d.applied = append(d.applied, ev.ID)
		}
	}
	d.mark, d.at = m.Last, time.Now()
	return outs, nil
}

// stream is a model of the journal's stream: its entries in order, and
// the sequences its retention took.
type stream struct {
	entries []Entry
	head    time.Time // when its first entry was written
	fail    error
	reads   int
	page    int    // entries per page; 2 when 0
	atPage  func() // runs before each page is handed over
}

func (s *stream) Append(_ context.Context, entries []Entry) error {
	if s.fail != nil {
		return s.fail
	}
	if s.head.IsZero() {
		s.head = time.Now()
	}
	s.entries = append(s.entries, entries...)
	return nil
}

// readAll hands over pages of two entries, unless told otherwise, so that
// restores cross pages.
func (s *stream) readAll(_ context.Context, since time.Time, wants map[string]*want) error {
	s.reads++
	size := cmp.Or(s.page, 2)
	page := func(w *want) {
		if s.atPage != nil {
			s.atPage()
		}
		w.err = w.page(w.found)
		w.found.Entries = nil
	}
	for _, w := range wants {
		w.found = Found{Tail: w.after, FromStart: since.IsZero(), Head: s.head}
	}
	for _, e := range s.entries {
		w := wants[e.Queue]
		if w == nil || w.err != nil {
			continue
		}
		f := &w.found
		if f.First == 0 {
			f.First = e.Seq
		}
		f.Tail = max(f.Tail, e.Seq)
		if e.Seq > w.after {
			f.Entries = append(f.Entries, e)
		}
		if len(f.Entries) == size {
			page(w)
		}
	}
	for _, w := range wants {
		if w.err == nil && len(w.found.Entries) > 0 {
			page(w)
		}
	}
	return nil
}

// trim drops the stream's first n entries, as its retention does.
func (s *stream) trim(n int) {
	s.entries = s.entries[n:]
	s.head = time.Now()
}

func newLane(db *database, s *stream) *Lane {
	return &Lane{j: s, queue: "q.0", inner: modelLane{db}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

func events(n int) []event.Event {
	out := make([]event.Event, n)
	for i := range out {
		out[i] = event.Event{ID: fmt.Sprintf("ev-%03d", i), Type: "TransferCreated"}
	}
	return out
}

// ids are evs' event ids, in order.
func ids(evs []event.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.ID
	}
	return out
}

func applyAll(t *testing.T, l *Lane, evs []event.Event, batch int) {
	t.Helper()
	for i := 0; i < len(evs); i += batch {
		if _, err := l.ApplyBatch(t.Context(), evs[i:min(i+batch, len(evs))]); err != nil {
			t.Fatal(err)
		}
	}
}

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
		_, _ = l.ApplyBatch(t.Context(), []event.Event{ev})
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

// An entry the journal could not take is never acked: the attempt fails
// as the environment's, and the retry, a duplicate, is journaled then.
func TestAnEventTheJournalDidNotTakeIsNotAcked(t *testing.T) {
	db, s := &database{}, &stream{fail: errors.New("stream down")}
	l := newLane(db, s)
	ev := events(1)
	_, err := l.ApplyBatch(t.Context(), ev)
	if event.ClassOf(t.Context(), err) != event.ClassTransient {
		t.Fatalf("%v, want a transient error", err)
	}
	s.fail = nil
	outs, err := l.ApplyBatch(t.Context(), ev)
	if err != nil || !outs[0].Duplicate || len(s.entries) != 1 || s.entries[0].Seq != 2 {
		t.Fatalf("retry: %v %v, entries %+v; want a duplicate journaled as entry 2", outs, err, s.entries)
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
		if _, err := l.ApplyBatch(t.Context(), events(4)[3:]); err == nil {
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
	_, err := l.ApplyBatch(t.Context(), events(11)[10:])
	var short *ShortError
	if !errors.As(err, &short) || short.Missing() != 3 || short.Mark != 4 || short.First != 8 {
		t.Fatalf("%v, want a ShortError of 3 events (5 to 7)", err)
	}
	reads := s.reads
	for range 3 { // the worker's retries while the queue waits
		if _, err := l.ApplyBatch(t.Context(), events(11)[10:]); !errors.As(err, &short) {
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
	entries := []Entry{{Queue: "q.0", Seq: 7, Event: ev}, {Queue: "q.0", Seq: 8, Event: ev, Dead: true}, {Queue: "q.1", Seq: 1, Event: ev}}
	msgs, err := messages(entries)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 2 || msgs[0].Headers[hQueue] != "q.0" || msgs[0].Headers[hFirst] != int64(7) || msgs[0].Headers[hLast] != int64(8) {
		t.Fatalf("%d messages, the first's headers %v; want 2, the first of q.0's 7 to 8", len(msgs), msgs[0].Headers)
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
	msgs, err = messages(big)
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

// A queue with no traffic is restored by the watch: kicked (as a new
// database connection kicks it), it checks every lane, and the lane whose
// database lost commits applies them again from the journal without an
// event of its own. A lane whose database holds its mark is checked
// without reading the stream.
func TestTheWatchRestoresAnIdleQueue(t *testing.T) {
	db, s := &database{}, &stream{}
	l := newLane(db, s)
	evs := events(9)
	applyAll(t, l, evs, 2)
	db.lose(2)
	restored := make(chan int, 3)
	l.Restored = func(_ string, n int) { restored <- n }
	j := &Journal{}
	j.watch(l)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); j.Watch(ctx, time.Hour, l.log) }()
	for n := 0; n < 3; {
		select {
		case m := <-restored:
			n += m
		case <-time.After(30 * time.Second):
			t.Fatalf("the watch restored %d entries, want 3", n)
		}
	}
	cancel()
	<-done
	want := ids(evs)
	if !slices.Equal(db.applied, want) || db.mark != 9 {
		t.Fatalf("applied %v (mark %d), want %v (mark 9)", db.applied, db.mark, want)
	}
	reads := s.reads
	if _, err := l.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	if s.reads != reads {
		t.Errorf("a check of a lane whose database holds its mark read the stream")
	}
	l.Close()
	if len(j.lanes) != 0 {
		t.Errorf("a closed lane is still watched")
	}
}

// Two replicas: a (its consumer inactive) and b, which consumes the queue
// and moves the mark. a's checks see the mark move and read nothing
// meanwhile; the database then loses all that b applied, back to the very
// mark a went on from, and b is gone: a, consuming now, reads the
// journal before it applies and restores b's events first.
func TestALaneWhoseMarkAnotherMovedReadsTheJournalBeforeItApplies(t *testing.T) {
	db, s := &database{}, &stream{}
	a, b := newLane(db, s), newLane(db, s)
	if _, err := a.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	evs := events(7)
	for i := range 6 {
		applyAll(t, b, evs[i:i+1], 1)
		if _, err := a.Check(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if s.reads != 2 {
		t.Fatalf("%d reads, want 2 (each lane's first): a read the stream while b moved the mark", s.reads)
	}
	db.lose(6)
	applyAll(t, a, evs[6:], 1)
	want := ids(evs)
	if !slices.Equal(db.applied, want) || db.mark != 7 {
		t.Fatalf("applied %v (mark %d), want %v (mark 7)", db.applied, db.mark, want)
	}
}

// A restore applies the journal's entries in transactions of up to
// restoreBatch events, and each page of the read before the next is
// read, so a gap of any size holds one page in memory.
func TestARestoreAppliesPageByPageInBatches(t *testing.T) {
	db, s := &database{}, &stream{}
	l := newLane(db, s)
	evs := events(450)
	applyAll(t, l, evs, 1)
	db.lose(450)
	s.page = 200
	var marks []int64
	s.atPage = func() { marks = append(marks, db.mark) }
	txs := db.txs
	if n, err := l.Check(t.Context()); err != nil || n != 450 {
		t.Fatalf("restored %d (%v), want 450", n, err)
	}
	if got := db.txs - txs; got != 5 { // 100+100, 100+100, 50
		t.Errorf("the restore took %d transactions, want 5 (pages of 200 in batches of %d)", got, restoreBatch)
	}
	if !slices.Equal(marks, []int64{0, 200, 400}) {
		t.Errorf("the database's mark at each page was %v, want [0 200 400]: each page applied before the next is read", marks)
	}
	if len(db.applied) != 450 || db.applied[449] != "ev-449" || db.mark != 450 {
		t.Errorf("applied %d events, last %s, mark %d", len(db.applied), db.applied[len(db.applied)-1], db.mark)
	}
}

// An entry the database refuses when it is applied again (it was applied
// and acked once) does not hold back the others of its batch: the batch
// is applied one by one, the refused entry is passed over and logged, and
// the rest are applied in order.
func TestAnEntryRefusedOnRestoreDoesNotHoldItsBatch(t *testing.T) {
	db, s := &database{}, &stream{page: 10}
	l := newLane(db, s)
	evs := events(5)
	applyAll(t, l, evs, 1)
	db.lose(5)
	db.refuse = map[string]error{"ev-002": event.Transition(errors.New("no longer allowed"))}
	if _, err := l.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	if want := []string{"ev-000", "ev-001", "ev-003", "ev-004"}; !slices.Equal(db.applied, want) || db.mark != 5 {
		t.Errorf("applied %v (mark %d), want %v (mark 5)", db.applied, db.mark, want)
	}
}

// The watch never holds up a worker that is applying: a check of a lane
// in use passes it over, without reading the database or the stream.
func TestACheckPassesOverALaneInUse(t *testing.T) {
	db, s := &database{}, &stream{}
	l := newLane(db, s)
	applyAll(t, l, events(3), 1)
	db.lose(1)
	db.down = errors.New("must not be read")
	l.mu.Lock()
	n, err := l.Check(t.Context())
	l.mu.Unlock()
	if n != 0 || err != nil || s.reads != 1 {
		t.Fatalf("a check of a lane in use returned %d, %v after %d reads; want it passed over", n, err, s.reads)
	}
	db.down = nil
	if n, err := l.Check(t.Context()); n != 1 || err != nil {
		t.Fatalf("the next check restored %d (%v), want 1", n, err)
	}
}

// A queue's next lane in the same process (after a broker reconnect) goes
// on from the mark its last lane closed synced at, without reading the
// stream; if the database lost commits meanwhile, its first transaction
// finds the gap and restores it.
func TestTheNextLaneOfAQueueGoesOnFromTheLast(t *testing.T) {
	db, s := &database{}, &stream{}
	j := &Journal{}
	wrap := func() *Lane {
		l := newLane(db, s)
		j.watch(l)
		return l
	}
	evs := events(9)
	l := wrap()
	applyAll(t, l, evs[:3], 1)
	l.Close()
	l = wrap()
	applyAll(t, l, evs[3:6], 1)
	if s.reads != 1 {
		t.Fatalf("%d reads, want the first lane's alone", s.reads)
	}
	l.Close()
	db.lose(2)
	l = wrap()
	applyAll(t, l, evs[6:], 1)
	if s.reads != 2 {
		t.Errorf("%d reads, want one more for the gap", s.reads)
	}
	want := ids(evs)
	if !slices.Equal(db.applied, want) || db.mark != 9 {
		t.Fatalf("applied %v (mark %d), want %v (mark 9)", db.applied, db.mark, want)
	}
}

// At start every queue is compared and restored in one read of the
// stream, not one per queue; the queues' lanes the workers then open go
// on from the marks that read left, without reading again.
func TestAStartRestoresEveryQueueInOneRead(t *testing.T) {
	s := &stream{}
	queues := []string{"q.0", "q.1", "q.2"}
	dbs := map[string]*database{}
	lane := func(q string) *Lane {
		l := newLane(dbs[q], s)
		l.queue = q
		return l
	}
	evs := events(30)
	for _, q := range queues {
		dbs[q] = &database{}
	}
	// The queues' events interleave in the stream.
	for i := 0; i < 10; i++ {
		for k, q := range queues {
			l := lane(q)
			l.prev, l.synced = dbs[q].mark, true
			applyAll(t, l, evs[3*i+k:3*i+k+1], 1)
		}
	}
	for _, q := range queues {
		dbs[q].lose(4)
	}
	j := &Journal{}
	var lanes []*Lane
	for _, q := range queues {
		l := lane(q)
		j.watch(l)
		lanes = append(lanes, l)
	}
	reads := s.reads
	applied, errs := recoverAll(t.Context(), s, lanes)
	if len(errs) != 0 || s.reads != reads+1 {
		t.Fatalf("errors %v after %d reads; want none after one read", errs, s.reads-reads)
	}
	for k, q := range queues {
		if applied[q] != 4 || len(dbs[q].applied) != 10 || dbs[q].mark != 10 {
			t.Errorf("%s: %d applied again, %d in the database, mark %d; want 4, 10, 10", q, applied[q], len(dbs[q].applied), dbs[q].mark)
		}
		if want := evs[3*9+k].ID; dbs[q].applied[9] != want {
			t.Errorf("%s: last applied %s, want %s", q, dbs[q].applied[9], want)
		}
	}
	for _, l := range lanes {
		l.Close()
	}
	for i, q := range queues {
		l := lane(q)
		j.watch(l)
		applyAll(t, l, events(31)[30:], 1)
		if s.reads != reads+1 {
			t.Fatalf("queue %d's next lane read the stream again", i)
		}
	}
}
