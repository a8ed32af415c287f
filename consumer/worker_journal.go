package consumer

import (
	"fmt"

	"transferconsumer/event"
)

// With the journal (a journaledLane), a transaction's events are acked
// only once the broker confirmed its entries in the journal's stream, and
// the worker applies its next events meanwhile: the core's acks and
// rejects wait in the worker (later), in the core's order, until what they
// settle is journaled. The core takes them as sent; the broker holds the
// messages until they are. A settlement that can no longer be sent (the
// channel closed, the broker cancelled the consumer, the shutdown timeout
// passed) is dropped: its messages go back to the queue with the rest, and
// come back as duplicates, which the inbox drops and the journal takes
// again.

// prefetchFor is a queue's prefetch with BATCH_MAX batch through lane:
// BATCH_MAX (1 unless batches are on), so that what the broker gave us is
// the batch in hand at most, and a crash returns one batch. With the
// journal, twice that, at BATCH_MAX 1 too: a batch's acks (an event's)
// wait for the journal's confirm while the next is applied, and the
// broker must have let that one come (BENCHMARKS.md, "The journal"). The
// one worker still applies them one after the other, in the queue's
// order.
func prefetchFor(batchMax int, lane event.Lane) int {
	n := max(1, batchMax)
	if _, ok := lane.(journaledLane); ok {
		n *= 2
	}
	return n
}

// awaitJournal notes, for the deliveries of slots just tried, what their
// settlement waits for: the confirm of the entries of every transaction
// committed so far. An attempt that failed may have committed (a producer
// conflict, the answer to a COMMIT lost); one that did not makes them
// wait for earlier ones, which their settlement, in order, does anyway.
func (w *worker) awaitJournal(slots []*slot) {
	jl, ok := w.lane.(journaledLane)
	if !ok {
		return
	}
	c := jl.Journaled()
	if c == nil {
		return
	}
	for _, s := range slots {
		if h := w.held[s.Tag]; h != nil {
			h.journaled = c
		}
	}
}

// deferred keeps cmd, an ack or a reject, for later when what it settles
// is not journaled yet, or when another settlement waits before it: the
// channel sends settlements in the order the core gave them.
func (w *worker) deferred(cmd command) bool {
	if len(w.later) == 0 && w.journaled(cmd) {
		return false
	}
	w.later = append(w.later, cmd)
	return true
}

// journaled reports whether every delivery cmd settles is journaled.
func (w *worker) journaled(cmd command) bool {
	for _, st := range cmd.Settled {
		h := w.held[st.Slot.Tag]
		if h == nil || h.journaled == nil {
			continue
		}
		select {
		case <-h.journaled:
			h.journaled = nil
		default:
			return false
		}
	}
	return true
}

// waitingOn returns what the first settlement kept for later waits on;
// nil when none is kept.
func (w *worker) waitingOn() <-chan struct{} {
	if len(w.later) == 0 {
		return nil
	}
	for _, st := range w.later[0].Settled {
		if h := w.held[st.Slot.Tag]; h != nil && h.journaled != nil {
			return h.journaled
		}
	}
	return nil
}

// sendLater sends, in order, the settlements kept for later whose
// deliveries are journaled now. It returns false when the channel failed
// one: the core is told, and the rest go back with the channel.
func (w *worker) sendLater() bool {
	for w.laterDue() {
		if !w.sendFirst() {
			return false
		}
	}
	return true
}

// laterDue reports whether the first settlement kept for later can be
// sent now.
func (w *worker) laterDue() bool { return len(w.later) > 0 && w.journaled(w.later[0]) }

// sendFirst sends the first settlement kept for later; false when the
// channel failed it: the core is told, and the rest go back with the
// channel.
func (w *worker) sendFirst() bool {
	cmd := w.later[0]
	w.later = w.later[1:]
	if err := w.settle(cmd); err != nil {
		w.fail(err)
		w.dropLater("the channel failed")
		w.core.channelClosed()
		return false
	}
	return true
}

// flushLater waits, while work lasts (to SHUTDOWN_TIMEOUT past shutdown:
// Run, service.go), until the settlements kept for later can be sent, and
// sends them, before the channel closes; what it cannot send goes back
// with the close. It returns false when the channel failed a settlement.
func (w *worker) flushLater() bool {
	for {
		if !w.sendLater() {
			return false
		}
		if len(w.later) == 0 {
			return true
		}
		if w.work.Err() != nil {
			w.dropLater("the shutdown timeout passed")
			return true
		}
		switch h := w.loop.next(w.work.Done(), w.waitingOn()); h.Kind {
		case hGone, hClosed:
			w.dropLater("the channel closed")
			return true
		case hDelivery:
			// It goes back with the close.
		}
	}
}

// dropLater drops the settlements kept for later, and says so: their
// messages go back to the queue (why: because of what).
func (w *worker) dropLater(why string) {
	for _, cmd := range w.later {
		back := make([]settlement, len(cmd.Settled))
		for i, st := range cmd.Settled {
			back[i] = settlement{Slot: st.Slot, Action: ActionRequeue, Class: event.ClassShutdown,
				Err: fmt.Errorf("%s before its settlement (%s) could be sent: it goes back to the queue; "+
					"committed, it comes back as a duplicate", why, st.Action)}
		}
		w.settled(back, nil)
	}
	w.later = nil
}
