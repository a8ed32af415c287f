package journal

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"transferconsumer/event"
)

// keepAfter is short in these tests, so that they wait for nothing long;
// none depends on how short.
const keepAfter = 20 * time.Millisecond

// waitFor waits, for a minute at most, until cond holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(time.Minute); !cond(); <-tick.C {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after a minute waiting for %s", what)
		}
	}
}

func seqsOf(entries []Entry) []int64 {
	out := make([]int64, len(entries))
	for i, e := range entries {
		out[i] = e.Seq
	}
	return out
}

// While the stream does not take a transaction's entries (a broker alarm
// holds every publish), they are kept in the database within keepAfter,
// and the acks go: the backlog drains, and no held delivery runs into the
// broker's consumer timeout. Later transactions' entries are kept behind
// them, at once. Each kept entry is counted as unprotected until the
// stream, healed, takes it; then the stream holds every entry once, in
// the order of the commits, and the count is back at zero.
func TestEntriesTheStreamDoesNotTakeAreKeptAndTheAcksGo(t *testing.T) {
	db, s, k := &database{}, &stream{}, &spill{}
	var unprotected atomic.Int64
	l := newLaneWith(db, s, Config{Spill: k, KeepAfter: keepAfter,
		Reports: Reports{Unprotected: func(_ string, n int) { unprotected.Add(int64(n)) }}})
	defer l.Close()
	evs := events(6)
	applyAll(t, l, evs[:1], 1)
	s.hold(false)
	applyAll(t, l, evs[1:3], 2) // waits for its ack: kept once the stream did not answer
	applyAll(t, l, evs[3:4], 1) // kept behind, without trying the stream first
	if n := k.kept(); n != 3 || unprotected.Load() != 3 {
		t.Fatalf("%d entries kept, %d counted unprotected; want 3 and 3", n, unprotected.Load())
	}
	// The writer, idle, tries the stream for the kept entries, which it
	// still does not take; a transaction meanwhile is kept all the same.
	tried := s.refusals()
	waitFor(t, "the stream tried again for the kept entries", func() bool { return s.refusals() > tried })
	applyAll(t, l, evs[4:5], 1)
	s.mu.Lock()
	held := seqsOf(s.entries)
	s.mu.Unlock()
	if got := held; !slices.Equal(got, []int64{1}) {
		t.Fatalf("the stream holds %v while it takes nothing; want 1", got)
	}
	if n := k.kept(); n != 4 {
		t.Fatalf("%d entries kept, want 4", n)
	}
	s.let()
	waitFor(t, "the kept entries to reach the stream", func() bool { return k.kept() == 0 })
	applyAll(t, l, evs[5:], 1)
	s.mu.Lock()
	got := seqsOf(s.entries)
	s.mu.Unlock()
	if !slices.Equal(got, []int64{1, 2, 3, 4, 5, 6}) || unprotected.Load() != 0 {
		t.Fatalf("the stream holds %v, %d unprotected; want 1 … 6 in order, 0", got, unprotected.Load())
	}
	if !slices.Equal(db.applied, ids(evs)) {
		t.Fatalf("applied %v, want each event once", db.applied)
	}
}

// Entries kept in the database by a lane that closed before the stream
// took them (a process that stopped during an alarm) go to the stream
// before the next lane's of the queue, so the stream keeps the order of
// the commits.
func TestEntriesKeptByAFormerLaneGoFirst(t *testing.T) {
	db, s, k := &database{}, &stream{}, &spill{}
	cfg := Config{Spill: k, KeepAfter: keepAfter}
	evs := events(4)
	closedWithTwoKept(t, newLaneWith(db, s, cfg), s, k, evs)
	s.let()
	var unprotected atomic.Int64
	cfg.Reports.Unprotected = func(_ string, n int) { unprotected.Add(int64(n)) }
	b := newLaneWith(db, s, cfg)
	defer b.Close()
	b.prev, b.synced = db.mark, true // as the start's read leaves it
	applyAll(t, b, evs[3:], 1)
	if got := seqsOf(s.entries); !slices.Equal(got, []int64{1, 2, 3, 4}) || k.kept() != 0 || unprotected.Load() != 0 {
		t.Fatalf("the stream holds %v, %d kept, %d unprotected; want 1 2 3 4, none, 0", got, k.kept(), unprotected.Load())
	}
}

// A write that reached the stream but whose confirm never came is kept in
// the database, and written again once the stream takes writes: the stream
// then holds its entries twice. A restore applies each once, and counts
// each once.
func TestACopyOfAnEntryIsAppliedOnce(t *testing.T) {
	db, s, k := &database{}, &stream{}, &spill{}
	l := newLaneWith(db, s, Config{Spill: k, KeepAfter: keepAfter})
	defer l.Close()
	evs := events(5)
	applyAll(t, l, evs[:1], 1)
	s.hold(true)
	applyAll(t, l, evs[1:4], 3)
	s.let()
	waitFor(t, "the kept entries to reach the stream", func() bool { return k.kept() == 0 })
	applyAll(t, l, evs[4:], 1)
	if got := seqsOf(s.entries); !slices.Equal(got, []int64{1, 2, 3, 4, 2, 3, 4, 5}) {
		t.Fatalf("the stream holds %v; want 2 3 4 twice", got)
	}
	db.lose(2)
	n, err := l.Recover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if n != 4 || !slices.Equal(db.applied, ids(evs)) || db.mark != 5 {
		t.Fatalf("%d applied again, %v in the database, mark %d; want 4, each event once in order, 5", n, db.applied, db.mark)
	}
}

// While neither the stream nor the database takes the entries, the acks
// wait, and the queue is reported stalled; once the database takes them,
// it is healed and the acks go.
func TestEntriesNeitherTakesHoldTheAcks(t *testing.T) {
	db, s, k := &database{}, &stream{}, &spill{}
	var stalled, healed atomic.Int64
	l := newLaneWith(db, s, Config{Spill: k, KeepAfter: keepAfter, Reports: Reports{
		Stalled: func(string, time.Time, int, string, error) { stalled.Add(1) },
		Healed:  func(string) { healed.Add(1) }}})
	defer l.Close()
	evs := events(2)
	applyAll(t, l, evs[:1], 1)
	s.hold(false)
	k.mu.Lock()
	k.down = errDown
	k.mu.Unlock()
	if _, err := l.ApplyBatch(t.Context(), evs[1:]); err != nil {
		t.Fatal(err)
	}
	journaled := l.Journaled()
	if journaled == nil {
		t.Fatal("acked while neither the stream nor the database took its entries")
	}
	waitFor(t, "the stall reported", func() bool { return stalled.Load() > 0 })
	select {
	case <-journaled:
		t.Fatal("acked while neither the stream nor the database took its entries")
	default:
	}
	k.mu.Lock()
	k.down = nil
	k.mu.Unlock()
	waitJournaled(t, l)
	if k.kept() != 1 || healed.Load() != 1 {
		t.Fatalf("%d kept, healed %d times; want 1 and 1", k.kept(), healed.Load())
	}
}

var errDown = event.Transient(errTest("the database is down"))

type errTest string

func (e errTest) Error() string { return string(e) }

// closedWithTwoKept has l apply evs[0], which the stream takes, then
// evs[1] and evs[2] while the stream holds every write, so that their
// entries are kept in the database and acked, and closes l, as a process
// that stops or reconnects during an alarm does.
func closedWithTwoKept(t *testing.T, l *Lane, s *stream, k *spill, evs []event.Event) {
	t.Helper()
	applyAll(t, l, evs[:1], 1)
	s.hold(false)
	applyAll(t, l, evs[1:3], 1)
	l.Close()
	if n := k.kept(); n != 2 {
		t.Fatalf("%d entries kept; want 2", n)
	}
}
