package consumer

import "transferconsumer/event"

// With the journal (a journaledLane), a transaction's events are acked
// only once its entries are held: confirmed by the journal's stream, or,
// while the stream does not take them (a broker alarm), kept in the
// database (adr/0014); the worker applies its next events meanwhile. The core decides when
// (core_when.go): the worker gives it a ticket for what each apply or
// park committed, watches the ticket the core's command names (Await),
// and tells the core once the journal holds it. A settlement that can no
// longer be sent (the channel closed, the broker cancelled the consumer,
// the shutdown timeout passed) the core drops: its messages go back to
// the queue with the rest, and come back as duplicates, which the inbox
// drops and the journal takes again.

// prefetchFor is a queue's prefetch with BATCH_MAX batch through lane:
// BATCH_MAX (1 unless batches are on), so that what the broker gave us is
// the batch in hand at most, and a crash returns one batch. With the
// journal, twice that, at BATCH_MAX 1 too: a batch's acks (an event's)
// wait for the journal to hold its entries while the next is applied, and
// the broker must have let that one come (BENCHMARKS.md, "The journal"). The
// one worker still applies them one after the other, in the queue's
// order.
func prefetchFor(batchMax int, lane event.Lane) int {
	n := max(1, batchMax)
	if _, ok := lane.(journaledLane); ok {
		n *= 2
	}
	return n
}

// awaitJournal tells the core, after an apply or a park, the ticket its
// deliveries' settlements wait for: the entries of every transaction
// committed so far, held. An attempt that failed may have committed (a
// producer conflict, the answer to a COMMIT lost); one that did not makes
// them wait for earlier ones, which their settlement, in order, does
// anyway. A lane that has nothing unheld holds every ticket given so far.
func (w *worker) awaitJournal() {
	jl, ok := w.lane.(journaledLane)
	if !ok {
		return
	}
	c := jl.Journaled()
	if c == nil {
		w.core.journaled(w.ticket)
		return
	}
	if c != w.tickets[w.ticket] {
		if w.tickets == nil {
			w.tickets = map[uint64]<-chan struct{}{}
		}
		w.ticket++
		w.tickets[w.ticket] = c
	}
	w.core.journaling(w.ticket)
}

// journaled: what ticket waits on is closed: the journal holds what was
// committed up to it. The core is told; the tickets it covers are
// forgotten.
func (w *worker) journaled(ticket uint64) {
	w.core.journaled(ticket)
	for t := range w.tickets {
		if t <= ticket {
			delete(w.tickets, t)
		}
	}
}
