package journal

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// shortFlush bounds a restore's wait for the lane's own entries for the
// rest of the test, so that a lane that waits for them fails at once
// instead of after 10 s.
func shortFlush(t *testing.T) {
	was := flushFor
	flushFor = 100 * time.Millisecond
	t.Cleanup(func() { flushFor = was })
}

// A handover while the stream holds a lane's entries (an alarm, a stream
// that is down): another replica took the queue and moved the mark on,
// then this lane gets the queue back. Its own entries on their way are
// below the mark, which the database holds, so the read that syncs the
// lane cannot need them: it applies at once, as it would without the
// journal, instead of waiting for the stream until the alarm passes.
func TestAHandoverWhileTheStreamHoldsTheLanesEntriesDoesNotWaitForThem(t *testing.T) {
	shortFlush(t)
	db, s := &database{}, &stream{}
	a := newLane(db, s)
	defer a.Close()
	evs := events(4)
	applyAll(t, a, evs[:1], 1)
	s.hold(false)
	if _, err := a.ApplyBatch(t.Context(), evs[1:2]); err != nil {
		t.Fatal(err)
	}
	b := newLane(db, s) // the other replica, its first transaction after a read
	defer b.Close()
	if _, err := b.ApplyBatch(t.Context(), evs[2:3]); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ApplyBatch(t.Context(), evs[3:4]); err != nil {
		t.Fatalf("the lane whose entries the stream holds, back after a handover: %v", err)
	}
	if db.mark != 4 || len(db.applied) != 4 {
		t.Fatalf("mark %d, %d events applied; want 4 and 4", db.mark, len(db.applied))
	}
}

// A restart during an alarm, after the former process kept entries in
// the database: those entries are below the database's mark (each is kept
// only after the commit that moved the mark past it), so the new lane's
// read cannot need them in the stream first. It goes on from the mark its
// last read vouched for, as a start during an alarm does, and keeps its
// own entries behind the former ones; before, it waited for the stream to
// take the former ones, until the alarm passed.
func TestARestartDuringAnAlarmAfterEntriesWereKeptDoesNotWaitForTheStream(t *testing.T) {
	shortFlush(t)
	db, s, k := &database{}, &stream{}, &spill{}
	cfg := Config{Spill: k, KeepAfter: keepAfter}
	evs := events(4)
	closedWithTwoKept(t, newLaneWith(db, s, cfg), s, k, evs)
	s.blocked = true // the alarm holds a read's fence too
	b := newLaneWith(db, s, cfg)
	defer b.Close()
	if _, err := applyBatch(t, b, evs[3:]); err != nil {
		t.Fatalf("a new process during the alarm: %v", err)
	}
	if n := k.kept(); n != 3 || len(db.applied) != 4 {
		t.Fatalf("%d entries kept, %d events applied; want 3 and 4", n, len(db.applied))
	}
	s.blocked = false
	s.let()
	if err := b.out.flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	got := seqsOf(s.entries)
	s.mu.Unlock()
	if want := []int64{1, 2, 3, 4}; !slices.Equal(got, want) {
		t.Fatalf("the stream holds %v; want %v, in order", got, want)
	}
}

// A broker reconnect during an alarm, after a queue's lane kept entries
// in the database: the queue's next lane in the same process has its
// writer take them to the stream once it takes writes again, even while
// the queue has no event, and they are counted unprotected once, not once
// per lane. Before, the next lane looked for them only at its first
// write, and the closed lane's count stayed: the gauge never came back
// to 0 (integration TestARestartDuringAnAlarmAfterEntriesWereKeptDrainsTheBacklog, "reconnected").
func TestTheNextLaneAfterAReconnectTakesOverTheKeptEntries(t *testing.T) {
	db, s, k := &database{}, &stream{}, &spill{}
	var unprotected atomic.Int64
	cfg := Config{Spill: k, KeepAfter: keepAfter, Reports: Reports{Unprotected: func(_ string, n int) { unprotected.Add(int64(n)) }}}
	j := &Journal{}
	wrap := func() *Lane {
		l := newLaneWith(db, s, cfg)
		j.watch(l)
		return l
	}
	closedWithTwoKept(t, wrap(), s, k, events(3))
	l := wrap() // the queue's next lane, after the reconnect: no event comes
	defer l.Close()
	s.let()
	waitFor(t, "the kept entries in the stream, with no event on the queue", func() bool { return k.kept() == 0 })
	waitFor(t, "no entry counted unprotected", func() bool { return unprotected.Load() == 0 })
}
