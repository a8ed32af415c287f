package consumer

import "transferconsumer/event"

// The model's journal: with it (one schedule in three, sim.journal), a
// replica's lane is a journaledLane (mapp.Journaled), each commit's entries
// wait for the broker's confirm, which the schedule gives at any moment
// (confirm), or, in one journal schedule in four (sim.lateJournal), never
// before the replica's session ended; and the broker model fails any ack
// of a delivery whose commit's entries are unconfirmed (unjournaledHolds).
// The worker tells its core each ticket and each confirm; the core decides
// when the acks go (core_when.go).

// mentries is one commit's entries on their way to the journal: closed
// once the broker confirms them.
type mentries struct {
	msgs      map[string]bool // the messages applied (or found duplicates) in it
	journaled chan struct{}
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

// confirm: the broker confirms rp's oldest commit's entries in the
// journal; false when none waits.
func (s *sim) confirm(rp *replica) bool {
	if !rp.running || len(rp.unjournaled) == 0 {
		return false
	}
	if !s.calm && (rp.journalStuck || (s.lateJournal && !rp.ended)) {
		return false
	}
	e := rp.unjournaled[0]
	rp.unjournaled = rp.unjournaled[1:]
	close(e.journaled)
	s.logf("r%d's journal entries of %d messages are confirmed", rp.id, len(e.msgs))
	return true
}

// unjournaled reports whether rp applied m in a commit whose journal
// entries are not confirmed yet.
func (rp *replica) unjournaledHolds(m *mmsg) bool {
	for _, e := range rp.unjournaled {
		if e.msgs[m.id] {
			return true
		}
	}
	return false
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
