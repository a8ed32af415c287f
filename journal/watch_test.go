package journal

// The watch, restores page by page, and the start's one read; the models
// are lane_test.go's.

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"transferconsumer/event"
)

// A queue with no traffic is restored by the watch: kicked (as a new
// database connection kicks it), it checks every lane, and the lane whose
// database lost commits applies them again from the journal without an
// event of its own. A lane whose database holds its mark is checked
// without reading the stream.
func TestTheWatchRestoresAnIdleQueue(t *testing.T) {
	db, s := &database{}, &stream{}
	restored := make(chan int, 3)
	l := newLaneWith(db, s, Config{Reports: Reports{Restored: func(_ string, n int) { restored <- n }}})
	evs := events(9)
	applyAll(t, l, evs, 2)
	db.lose(2)
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

// The same, but a never looks while b applies: the database loses all
// that b applied (a failover to a standby that was behind), back to the
// very mark a holds synced, and b is gone. The mark is where a left it,
// so only the failover tells: the database no longer vouches for the
// mark (journal_advance refuses to move it, and the watch's check sees
// it), and a reads the journal before it takes b's sequences again: at
// its first event, or at the watch's check while the queue is idle.
// Before, a went on from the mark as synced: its event took b's first
// sequence, and b's six events, acked, were never applied again.
func TestALaneGoesOnAfterAFailoverOnlyOnceItReadTheJournal(t *testing.T) {
	for _, idle := range []bool{false, true} {
		db, s := &database{}, &stream{}
		a, b := newLane(db, s), newLane(db, s)
		if _, err := a.Check(t.Context()); err != nil {
			t.Fatal(err)
		}
		evs := events(7)
		applyAll(t, b, evs[:6], 1)
		db.lose(6)
		if idle {
			if _, err := a.Check(t.Context()); err != nil {
				t.Fatal(err)
			}
			if want := ids(evs[:6]); !slices.Equal(db.applied, want) || db.mark != 6 {
				t.Fatalf("the watch's check of the idle queue: applied %v (mark %d), want %v (mark 6)", db.applied, db.mark, want)
			}
		}
		applyAll(t, a, evs[6:], 1)
		if want := ids(evs); !slices.Equal(db.applied, want) || db.mark != 7 {
			t.Fatalf("idle %v: applied %v (mark %d), want %v (mark 7)", idle, db.applied, db.mark, want)
		}
	}
}

// A check that finds an idle queue's mark where the lane left it, and
// vouched for in the database as it is now, raises the mark's time to when
// the check began, without reading the stream: the next read of the queue
// (a start's) reaches back to that check, not to when the mark last moved.
// A mark not vouched for here is left as it was until a read vouches.
func TestACheckOfAnIdleQueueRaisesItsMarksTime(t *testing.T) {
	db, s := &database{}, &stream{}
	l := newLane(db, s)
	applyAll(t, l, events(3), 1)
	hourAgo := time.Now().Add(-time.Hour)
	db.at = hourAgo
	reads := s.reads
	before := time.Now()
	if _, err := l.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	if db.at.Before(before) || s.reads != reads {
		t.Fatalf("the mark's time after a check of the idle queue: %s, %d reads; want it raised to the check's start (%s), and no read",
			db.at, s.reads-reads, before)
	}
	db.at, db.vouched = hourAgo, false // vouched for on another timeline: the check reads, then vouches
	if _, err := l.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	if s.reads != reads+1 || !db.vouched {
		t.Fatalf("a check of a mark not vouched for here: %d reads, vouched %v; want one read, and the mark vouched for", s.reads-reads, db.vouched)
	}
}

// A restore applies the journal's entries in transactions of up to
// restoreBatch events, and each page of the read before the next is
// read, so a gap of any size holds one page in memory.
func TestARestoreAppliesPageByPageInBatches(t *testing.T) {
	db, s, l := lostInPages(t, 450, 200)
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

// lostInPages returns a lane that applied and journaled n events, one per
// transaction, all of which its database then lost, over a stream that
// hands them over in pages of page entries.
func lostInPages(t *testing.T, n, page int) (*database, *stream, *Lane) {
	t.Helper()
	db, s := &database{}, &stream{page: page}
	l := newLane(db, s)
	applyAll(t, l, events(n), 1)
	db.lose(n)
	return db, s, l
}

// A restore cut short (the database gone between two pages; or the
// watch's ten seconds, a worker's retry, a shutdown) leaves the mark where
// its last batch moved it; the next restore goes on from there and
// reaches every entry left. A restore's moves keep the mark's time, where
// the next read starts: set to the batch's commit, that read began after
// the entries left, and found none of them.
func TestARestoreCutShortGoesOnFromWhereItStopped(t *testing.T) {
	db, s, l := lostInPages(t, 450, 200)
	pages := 0
	s.atPage = func() {
		if pages++; pages == 2 {
			db.down = errors.New("connection refused")
		}
	}
	if n, err := l.Check(t.Context()); err == nil || n != 200 {
		t.Fatalf("the restore cut short after its first page: %d applied (%v), want 200 and the error", n, err)
	}
	db.down, s.atPage = nil, nil
	if n, err := l.Check(t.Context()); err != nil || n != 250 {
		t.Fatalf("the next restore applied %d (%v), want the 250 left", n, err)
	}
	if !slices.Equal(db.applied, ids(events(450))) || db.mark != 450 {
		t.Errorf("applied %d events, mark %d; want all 450 in order, mark 450", len(db.applied), db.mark)
	}
}

// An entry the database refuses when it is applied again (it was applied
// and acked once) does not hold back the others of its batch: the batch
// is applied one by one, the refused entry ends as a dead letter with its
// class and reason (written before the mark moves past it: nothing acked
// vanishes), and the rest are applied in order.
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
	if len(db.outbox) != 1 || db.outbox[0].EventID != "ev-002" || db.outbox[0].Class != string(event.ClassTransition) ||
		!strings.Contains(db.outbox[0].Reason, "no longer allowed") || string(db.outbox[0].Body) != "{}" {
		t.Fatalf("dead letters %+v, want ev-002's, invalid-transition, with its reason and body", db.outbox)
	}
}

// A refused entry whose letter cannot be written (the database refuses
// that too) is not passed over: the restore stops before it, and the
// next one tries again.
func TestARefusedEntryIsNotPassedOverUntilItsLetterIsWritten(t *testing.T) {
	db, s := &database{}, &stream{page: 10}
	l := newLane(db, s)
	applyAll(t, l, events(3), 1)
	db.lose(3)
	db.outboxDown = errors.New("outbox down")
	db.refuse = map[string]error{"ev-001": event.Transition(errors.New("no longer allowed"))}
	if _, err := l.Check(t.Context()); err == nil || db.mark != 1 {
		t.Fatalf("%v, mark %d; want an error, the mark before the refused entry (1)", err, db.mark)
	}
	db.outboxDown = nil
	if _, err := l.Check(t.Context()); err != nil || db.mark != 3 || len(db.outbox) != 1 {
		t.Fatalf("%v, mark %d, %d letters; want the restore done, mark 3, one letter", err, db.mark, len(db.outbox))
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
		return makeLane(s, Config{}, q, modelLane{dbs[q]}, slog.New(slog.NewTextHandler(io.Discard, nil)))
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

// A restore the watch starts holds its lane, and so the queue's next
// event, for watchFor (10 s) at most, whatever the stream does: here the
// stream does not answer, and the check's read is bounded by 10 s
// (adr/0014), not by the start's two minutes.
func TestTheWatchHoldsALaneTenSecondsAtMost(t *testing.T) {
	db, s := &database{}, &stream{}
	l := newLane(db, s)
	applyAll(t, l, events(3), 1)
	db.lose(1)
	s.stuck = true
	j := &Journal{}
	j.watch(l)
	j.checkAll(t.Context(), l.log)
	if s.stuckFor <= 0 || s.stuckFor > 10*time.Second {
		t.Fatalf("the check's read could last %s, want 10 s at most", s.stuckFor)
	}
}

// The restores of the start (RestoreAtStart) are counted, as every other restore
// is: its lanes report to the journal's Reports, set before any lane
// opens.
func TestTheStartsRestoresAreCounted(t *testing.T) {
	db, s := &database{}, &stream{}
	applyAll(t, newLane(db, s), events(5), 1)
	db.lose(2)
	var restored int
	j := &Journal{cfg: Config{Reports: Reports{Restored: func(_ string, n int) { restored += n }}}}
	j.restoreAtStart(t.Context(), s, []string{"q.0"}, func() event.MarkedLane { return modelLane{db} }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if restored != 2 || db.mark != 5 {
		t.Fatalf("the start restored up to %d and counted %d, want 5 and 2", db.mark, restored)
	}
}
