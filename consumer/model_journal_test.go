package consumer

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"transferconsumer/event"
	"transferconsumer/journal"
)

// The model's journal: with it (one schedule in three, sim.journal), a
// replica's worker applies through the journal's real lane
// (journal.NewLane) over the model database (mapp's ApplyMarked, Marked,
// ParkMarked), and the lane's real writer, on its own goroutine, writes
// each commit's entries to the model's stream (mstream), where a write
// waits until the schedule confirms it (confirm): at any moment, or, in one
// journal schedule in four (sim.lateJournal), never before the replica's
// session ended, and never while an alarm blocks publishing. The broker
// model fails any ack of a delivery whose commit's entries the stream
// has not confirmed (unjournaledHolds), the letters parked through the
// lane included. The worker tells its core each ticket and each confirm;
// the core decides when the acks go (core_when.go).
//
// The writer is stepped as the worker is: after each of the worker's
// steps and each confirm, the schedule waits until the writer is waiting
// for the stream with every entry committed so far in its write or queued
// behind it (settleWriter), so that one seed is one interleaving here too.
// The lane runs without a spill: what keeps entries in the database while
// the stream does not take them waits on timers, which only the
// journal's own fault schedules drive (journal/schedule_test.go).

// mentries is one commit's entries on their way to the journal.
type mentries struct {
	msgs map[string]bool // the messages applied (or found duplicates, or parked) in it
	last int64           // its last sequence
}

// mwrite is a write of a replica's lane that waits for the stream.
type mwrite struct {
	msgs []event.Spilled
	done chan struct{} // closed once confirmed
}

// mstream is the journal's stream: what it holds, in order, and each
// replica's write that waits for its confirm. Its writers write from
// goroutines of their own: mu guards it, and each replica's jw and
// received.
type mstream struct {
	held  []heldMsg
	moved chan struct{} // a write began: the schedule looks again
}

type heldMsg struct {
	queue string
	msg   event.Spilled
	at    time.Time
}

// laneStream is the stream as one process of a replica writes to it.
type laneStream struct {
	s   *sim
	rp  *replica
	gen int
}

func (ls *laneStream) Write(ctx context.Context, queue string, msgs []event.Spilled) error {
	s, rp := ls.s, ls.rp
	w := &mwrite{msgs: msgs, done: make(chan struct{})}
	s.jmu.Lock()
	if rp.gen != ls.gen || rp.jw != nil {
		s.jmu.Unlock()
		s.record(fmt.Sprintf("replica %d: a journal write from process %d while process %d runs, or beside another write", rp.id, ls.gen, rp.gen))
		<-ctx.Done()
		return ctx.Err()
	}
	rp.jw = w
	for _, m := range msgs {
		rp.received += m.Entries
	}
	s.jmu.Unlock()
	select {
	case s.stream.moved <- struct{}{}:
	default:
	}
	select {
	case <-w.done:
		return nil
	case <-ctx.Done(): // the lane closed: its process is gone
		s.jmu.Lock()
		if rp.jw == w {
			rp.jw = nil
		}
		s.jmu.Unlock()
		return ctx.Err()
	}
}

// Scan hands over every message the stream holds: none of a queue is
// above the database's mark, since the model database loses no commit.
func (ls *laneStream) Scan(ctx context.Context, since time.Time, take func(string, event.Spilled, time.Time) (bool, error)) error {
	ls.s.jmu.Lock()
	held := append([]heldMsg(nil), ls.s.stream.held...)
	ls.s.jmu.Unlock()
	for _, h := range held {
		if done, err := take(h.queue, h.msg, h.at); done || err != nil {
			return err
		}
	}
	return nil
}

// openLane opens rp's journal lane over app, for the process of rp.gen.
func (s *sim) openLane(rp *replica, app *mapp) *journal.Lane {
	cfg := journal.Config{Letters: app}
	return journal.NewLane(&laneStream{s: s, rp: rp, gen: rp.gen}, cfg, "q", app, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// closeLane closes rp's lane, as its process ends: the writer stops, and
// what it had not written stays unconfirmed.
func (s *sim) closeLane(rp *replica) {
	if rp.lane == nil || rp.spinning {
		return
	}
	rp.lane.Close()
	rp.lane = nil
}

// settleWriter waits until rp's writer waits for the stream, or has
// nothing to write, with everything rp's lane committed so far in its
// write or queued behind it, and every commit confirmed so far told to
// the worker's channel (Journaled).
func (s *sim) settleWriter(rp *replica) {
	if rp.lane == nil || rp.spinning {
		return
	}
	deadline := time.NewTimer(busyLoop)
	defer deadline.Stop()
	for {
		s.jmu.Lock()
		writing, received, added := rp.jw != nil, rp.received, rp.added
		s.jmu.Unlock()
		if received > added {
			s.t.Fatalf("replica %d: the journal's writer wrote %d entries, the lane committed %d", rp.id, received, added)
		}
		if writing {
			return
		}
		var told <-chan struct{} // nil while entries are not in a write yet
		if received == added {
			if told = rp.lane.Journaled(); told == nil {
				return
			}
		}
		select {
		case <-s.stream.moved:
		case <-told:
		case <-deadline.C:
			s.t.Fatalf("replica %d: the journal's writer took %s to write what its lane committed (%d of %d entries)",
				rp.id, busyLoop, received, added)
		}
	}
}

// confirm: the stream confirms rp's write that waits; false when none
// waits, or the stream holds it back.
func (s *sim) confirm(rp *replica) bool {
	if !rp.running || rp.lane == nil {
		return false
	}
	if !s.calm && (rp.journalStuck || s.b.alarm || (s.lateJournal && !rp.ended)) {
		return false
	}
	s.jmu.Lock()
	w := rp.jw
	if w == nil {
		s.jmu.Unlock()
		return false
	}
	rp.jw = nil
	n := 0
	for _, m := range w.msgs {
		s.stream.held = append(s.stream.held, heldMsg{queue: "q", msg: m, at: time.Now()})
		n += m.Entries
	}
	s.jmu.Unlock()
	last := w.msgs[len(w.msgs)-1].Last
	keep := rp.unjournaled[:0]
	for _, e := range rp.unjournaled {
		if e.last > last {
			keep = append(keep, e)
		}
	}
	rp.unjournaled = keep
	close(w.done)
	s.logf("r%d's journal write of %d entries, up to %d, is confirmed", rp.id, n, last)
	s.settleWriter(rp)
	return true
}

// journaling notes the entries of a commit of rp that moved the mark to
// m.Last, of the messages ids.
func (rp *replica) journaling(m event.Mark, ids ...string) {
	e := &mentries{msgs: map[string]bool{}, last: m.Last}
	for _, id := range ids {
		e.msgs[id] = true
	}
	rp.unjournaled = append(rp.unjournaled, e)
	rp.added += int(m.Last - m.Prev)
}

// unjournaledHolds reports whether rp applied or parked m in a commit
// whose journal entries the stream has not confirmed yet.
func (rp *replica) unjournaledHolds(m *mmsg) bool {
	for _, e := range rp.unjournaled {
		if e.msgs[m.id] {
			return true
		}
	}
	return false
}

// closed reports whether c is closed; a nil c is not.
func closed(c <-chan struct{}) bool {
	if c == nil {
		return false
	}
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// timeoutWhileFlushing strikes a replica whose session ended while it
// waits, closing, for the journal to confirm what its core's acks wait
// for (core.awaiting), before the environment heals. Once in a schedule
// at most, the consumer timeout strikes the active one: on 4.3 the broker
// cancels the consumer, before it the channel closes (once, since a strike
// returns the messages, counted towards the delivery limit, as a
// disruption does). Or SHUTDOWN_TIMEOUT passes (the work's context ends),
// and its journal confirms nothing more meanwhile (the stream is down):
// the core must drop what waits, and the worker close and end.
func (s *sim) timeoutWhileFlushing() {
	for _, rp := range s.reps {
		flushing := rp.running && rp.ended && rp.at.kind == stopNext && rp.at.journaled != nil
		if !flushing || s.calm {
			continue
		}
		switch {
		case s.flushStrikes == 0 && s.b.active() == rp.cons && s.r.IntN(3) == 0 && s.b.timeout():
			s.flushStrikes++ // once: it returns the messages, counted, as a disruption does
			s.logf("consumer timeout while r%d waits for the journal to confirm what its acks wait for", rp.id)
		case !rp.journalStuck && s.r.IntN(4) == 0:
			rp.journalStuck = true
			rp.endWork(event.ErrShutdown)
			s.logf("SHUTDOWN_TIMEOUT passes while r%d waits for the journal, which confirms nothing more", rp.id)
		}
	}
}

// shutdownTimeout: nothing else can happen, and a replica whose session
// ended waits for the journal, which holds its confirm back (an alarm, a
// stall): SHUTDOWN_TIMEOUT passes. False when no replica waits so.
func (s *sim) shutdownTimeout() bool {
	for _, rp := range s.reps {
		if rp.running && rp.ended && !rp.journalStuck && rp.at.kind == stopNext && rp.at.journaled != nil {
			rp.journalStuck = true
			rp.endWork(event.ErrShutdown)
			s.logf("SHUTDOWN_TIMEOUT passes while r%d waits for the journal, which holds its confirm back", rp.id)
			return true
		}
	}
	return false
}
