package consumer

// The model's journal: with it (one schedule in three, sim.journal), a
// replica's lane is a journaledLane (mapp.Journaled), each commit's entries
// wait for the broker's confirm, which the schedule gives at any moment
// (confirm), and the broker model fails any ack of a delivery whose
// commit's entries are unconfirmed (unjournaledHolds).

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

// timeoutWhileFlushing: once in a schedule at most, before the
// environment heals, the consumer timeout strikes the active replica while
// it waits, closing, for the journal to confirm the acks it kept
// (worker.flushLater): on 4.3 the broker cancels the consumer, before it
// the channel closes. Once, since a strike returns the messages, counted
// towards the delivery limit, as a disruption does.
func (s *sim) timeoutWhileFlushing() {
	for _, rp := range s.reps {
		flushing := rp.running && rp.ended && rp.at.kind == stopNext && rp.at.journaled != nil
		if flushing && !s.calm && s.flushStrikes == 0 && s.b.active() == rp.cons && s.r.IntN(3) == 0 && s.b.timeout() {
			s.flushStrikes++ // once: it returns the messages, counted, as a disruption does
			s.logf("consumer timeout while r%d waits for the journal to confirm the acks it kept", rp.id)
		}
	}
}
