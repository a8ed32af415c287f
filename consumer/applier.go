package consumer

import (
	"context"
	"time"

	"transferconsumer/event"
)

// Applier applies one event in one local transaction, inbox claim and
// business effect together. A redelivered event comes back as
// Result{Duplicate: true} with a nil error. Errors are classified with
// event.Poison, Conflict or Transient; anything else counts as unknown.
type Applier interface {
	Apply(ctx context.Context, ev event.Event) (event.Result, error)
}

// Lanes is implemented by an Applier that can give each worker a lane of
// its own: the worker applies all its events through it, one at a time, so
// the lane can keep per-worker state (a database connection, a timer)
// instead of setting it up for every event.
type Lanes interface {
	// Lane returns a lane that bounds each attempt by timeout itself and
	// also ends it when the context given to Apply ends.
	Lane(timeout time.Duration) event.Lane
}

// BatchLane is a lane (event.Lane) that can apply several events in one
// local transaction (adr/0006).
type BatchLane interface {
	event.Lane
	// ApplyBatch applies evs, in order, in one transaction, and returns one
	// Outcome per event: its Result, or the error that event alone met (a
	// producer conflict). An error for the whole batch means nothing of it
	// was committed: the environment failed, or one of the events is one
	// the database refuses (a contradicting transition, data it rejects),
	// which the caller finds by splitting the batch.
	ApplyBatch(ctx context.Context, evs []event.Event) ([]event.Outcome, error)
}

// Prober is implemented by an Applier that can tell, without an event,
// whether applying one would work now: after a broker session ended while a
// queue was blocked, the service resumes consuming only once Probe passes,
// so that a long outage returns the message in hand to the broker once, not
// once per consumer timeout (adr/0002).
type Prober interface {
	Probe(ctx context.Context) error
}

// journaledLane is a lane whose commits the worker acks only once it says
// so: the journal's (journal.Lane), which writes each transaction's
// entries to its stream after the commit, while the worker goes on with
// the next transaction (adr/0014).
type journaledLane interface {
	// Journaled returns what is closed once every transaction the lane
	// has committed so far may be acked; nil when all may be.
	Journaled() <-chan struct{}
}

// parkingLane is a journaledLane that parks a dead letter itself, in a
// transaction that journals it (the journal's, adr/0014): the ack of a
// parked letter then waits for its entry, as an applied event's does, so
// that a failover or a restore that takes the parking back finds it.
type parkingLane interface {
	journaledLane
	Park(ctx context.Context, l event.OutboxLetter) error
}
