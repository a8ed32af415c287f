package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"transferconsumer/dlq"
)

// Batches (adr/0006). With BatchMax above 1 the queue's prefetch is
// BatchMax, and a worker takes what has already arrived, up to BatchMax,
// and applies it in one local transaction: one commit for the batch, then
// one ack with multiple=true. Poison is decoded out first and dead-lettered
// on its own, its copy confirmed before the ack covers its tag. The events
// are applied in delivery order by the queue's one consumer, so each
// account's order holds. A crash anywhere returns the batch's unacked
// messages, and the inbox absorbs what had been committed.

// collect returns a batch that starts with first: the deliveries that have
// already arrived, up to BatchMax, waiting at most BatchLinger for more. It
// also reports whether the deliveries channel closed meanwhile.
func (w *worker) collect(first amqp.Delivery) ([]amqp.Delivery, bool) {
	batch := append(w.batch[:0], first)
	limit := w.svc.cfg.BatchMax
	if w.narrow {
		limit = 1
	}
	var linger <-chan time.Time
	if w.svc.cfg.BatchLinger > 0 && limit > 1 {
		t := time.NewTimer(w.svc.cfg.BatchLinger)
		defer t.Stop()
		linger = t.C
	}
	for yielded := false; len(batch) < limit; {
		select {
		case d, ok := <-w.deliveries:
			if !ok {
				return batch, true
			}
			batch = append(batch, d)
			yielded = false
			continue
		default:
		}
		if !yielded {
			// A delivery that has arrived may still be on its way through
			// the client's buffering goroutine: let it run once.
			runtime.Gosched()
			yielded = true
			continue
		}
		if linger == nil {
			break // nothing more has arrived: no waiting for it
		}
		select {
		case d, ok := <-w.deliveries:
			if !ok {
				return batch, true
			}
			batch = append(batch, d)
		case <-linger:
			return batch, false
		}
	}
	w.batch = batch
	return batch, false
}

// handleBatch decides the fate of every delivery of ds and carries it out,
// as handle does for one: the applied and the duplicates are acked after
// the commit, with one multiple ack; the message's own faults are
// dead-lettered; the environment's are retried in place, the whole batch
// together. It returns an error only when the channel could not carry a
// decision out.
func (w *worker) handleBatch(session context.Context, ds []amqp.Delivery) error {
	start := time.Now()
	decs := make([]Decision, len(ds))
	var spans []trace.Span
	tracer := w.svc.cfg.Tracer
	if tracer != nil {
		spans = make([]trace.Span, len(ds))
	}
	var evs []Event
	var at []int // the delivery of each event
	for i, d := range ds {
		decs[i] = Decision{Queue: w.queue, EventID: d.MessageId, EventType: d.Type, Redelivered: d.Redelivered,
			DeliveryCount: dlq.DeliveryCount(d.Headers)}
		var span trace.Span
		if tracer != nil {
			var ctx context.Context
			ctx, span = w.startDelivery(tracer, d)
			spans[i] = span
			if i == 0 {
				w.traced = ctx // the batch's transaction is the first delivery's child
			}
		}
		decs[i].TraceID = traceID(span, d.Headers)
		ev, err := w.decode(d)
		if ev.ID != "" {
			decs[i].EventID = ev.ID
		}
		if ev.Type != "" {
			decs[i].EventType = ev.Type
		}
		if err != nil {
			decs[i].Err = err
			continue
		}
		evs = append(evs, ev)
		at = append(at, i)
	}
	w.traceID = decs[0].TraceID

	outs, retries := w.applyEvents(session, evs)
	outbox := false
	for k, o := range outs {
		i := at[k]
		decs[i].Duplicate, decs[i].Err, decs[i].Retries = o.Duplicate, o.Err, retries
		outbox = outbox || o.Outbox
	}
	crashed := false
	for i := range decs {
		decs[i].Class = ClassOf(session, decs[i].Err)
		decs[i].Action = decide(decs[i].Class)
		if decs[i].Action == ActionRetry {
			decs[i].Action = ActionRequeue // the broker session ended while retrying
		}
		crashed = crashed || decs[i].Class == ClassPanic
	}

	// Taking one message at a time already, a panic is returned like any
	// (handle does the same). Otherwise other messages may be in hand or on
	// their way, behind it: they are returned with it, in order.
	inBatch := crashed && !w.narrow
	sendErr := w.settle(session, ds, decs, inBatch)
	switch {
	case sendErr != nil, crashed && !inBatch:
	case inBatch:
		// The message that panicked and those behind it are still in hand:
		// closing the channel (by ending the session) returns them to the
		// head of the queue in their order, and from the next session this
		// queue is taken one message at a time until one passes, so that
		// they wait behind it without spending a delivery at each crash.
		w.svc.setNarrow(w.queue, true)
		sendErr = errPanicInBatch
	case w.narrow:
		sendErr = w.widen()
	}
	for i := range decs {
		decs[i].Duration = time.Since(start)
		w.svc.logDecision(decs[i], sendErr)
		if w.svc.cfg.Observe != nil {
			w.svc.cfg.Observe(decs[i])
		}
		if spans != nil {
			endDelivery(spans[i], decs[i])
		}
	}
	if sendErr != nil {
		return fmt.Errorf("queue %s: settle a batch of %d from event %s: %w", w.queue, len(ds), decs[0].EventID, sendErr)
	}
	if outbox {
		w.svc.drainOutbox(w.work, w.queue, w.publish)
	}
	return nil
}

// decode decodes d; a panic is a ClassPanic error, as in process.
func (w *worker) decode(d amqp.Delivery) (ev Event, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = w.panicked(d.MessageId, p)
		}
	}()
	ev, err = Decode(d.Body, d.MessageId, d.Type)
	if err == nil {
		ev.Message = Message{RoutingKey: d.RoutingKey, Body: d.Body, Headers: d.Headers,
			MessageID: d.MessageId, ContentType: d.ContentType}
	}
	return ev, err
}

// panicked logs a recovered panic with its stack and returns it as a
// ClassPanic error; the lane, which it may have left inside a transaction,
// is replaced.
func (w *worker) panicked(eventID string, p any) error {
	w.svc.log.Error("panic while handling a message; it is requeued, and the delivery limit ends a loop",
		"queue", w.queue, "event_id", eventID, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	w.renewLane()
	return &classified{class: ClassPanic, err: fmt.Errorf("panic: %v", p)}
}

// errBehindPanic is the outcome of the events that followed, in their
// batch, one whose handling panicked: they are returned to the queue
// unapplied, behind it, so that each account keeps its order.
var errBehindPanic = &classified{class: classBehindPanic, err: fmt.Errorf("returned behind a message whose handling panicked")}

// applyEvents applies evs in one transaction, retrying in place what the
// environment caused, and returns each event's outcome with the retries
// made. When the transaction fails because of one of the events (a
// transition that contradicts its transfer, data the database refuses, a
// panic), it splits evs in halves and applies them in order, until that
// event stands alone: the others still commit, in smaller transactions,
// and only it fails. After a panic, the events behind it are not applied.
func (w *worker) applyEvents(session context.Context, evs []Event) ([]Outcome, int) {
	if len(evs) == 0 {
		return nil, 0
	}
	var outs []Outcome
	retries, err := w.retryInPlace(session, evs[0].ID, func() (err error) {
		outs, err = w.attemptBatch(evs)
		return err
	})
	if err == nil {
		return outs, retries
	}
	class := ClassOf(session, err)
	if len(evs) > 1 && (causedByMessage(class) || class == ClassPanic) {
		mid := len(evs) / 2
		first, r1 := w.applyEvents(session, evs[:mid])
		var rest []Outcome
		r2 := 0
		if hasPanic(session, first) {
			rest = make([]Outcome, len(evs)-mid)
			for i := range rest {
				rest[i].Err = errBehindPanic
			}
		} else {
			rest, r2 = w.applyEvents(session, evs[mid:])
		}
		return append(first, rest...), retries + r1 + r2
	}
	outs = make([]Outcome, len(evs))
	for i := range outs {
		outs[i].Err = err
	}
	return outs, retries
}

func hasPanic(session context.Context, outs []Outcome) bool {
	for _, o := range outs {
		if c := ClassOf(session, o.Err); c == ClassPanic || c == classBehindPanic {
			return true
		}
	}
	return false
}

// attemptBatch applies evs once, within ApplyTimeout and while work lasts:
// one event through Apply, several through the lane's ApplyBatch (or, for
// an applier without batches, one after the other). A producer conflict is
// that event's outcome, not the batch's failure.
func (w *worker) attemptBatch(evs []Event) (outs []Outcome, err error) {
	defer func() {
		if p := recover(); p != nil {
			outs, err = nil, w.panicked(evs[0].ID, p)
		}
	}()
	if len(evs) == 1 {
		res, err := w.attempt(evs[0])
		if ClassOf(context.Background(), err) == ClassConflict {
			return []Outcome{{Err: err}}, nil
		}
		if err != nil {
			return nil, err
		}
		return []Outcome{{Result: res}}, nil
	}
	bl, ok := w.lane.(BatchLane)
	if !ok {
		outs = make([]Outcome, len(evs))
		for i, ev := range evs {
			if outs[i].Result, outs[i].Err = w.attempt(ev); outs[i].Err != nil &&
				ClassOf(context.Background(), outs[i].Err) != ClassConflict {
				return nil, outs[i].Err
			}
		}
		return outs, nil
	}
	var span trace.Span
	if t := w.svc.cfg.Tracer; t != nil {
		span = startTransaction(t, w.traced)
		span.SetAttributes(attribute.Int("messaging.batch.message_count", len(evs)))
	}
	outs, err = bl.ApplyBatch(w.work, evs)
	if span != nil {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
	return outs, err
}

// settle carries out the decisions about ds: each dead letter's copy is
// confirmed, and each requeue sent, before the one multiple ack that covers
// the applied and the dead-lettered; a delivery settled on its own is never
// the one the multiple ack names. It returns the first error the channel
// gave.
//
// After a panic (crashed), the message that panicked and those behind it
// are left in hand: closing the channel returns them in order.
func (w *worker) settle(session context.Context, ds []amqp.Delivery, decs []Decision, crashed bool) error {
	var ackUpTo *amqp.Delivery
	var first error
	note := func(err error) {
		if first == nil {
			first = err
		}
	}
	for i := range ds {
		switch decs[i].Action {
		case ActionAck:
			ackUpTo = &ds[i]
		case ActionDeadLetter:
			switch w.copyToDLQ(ds[i], decs[i]) {
			case copied:
				ackUpTo = &ds[i]
			case copyCut:
				decs[i].Action = ActionRequeue
				note(ds[i].Nack(false, true))
			case copyRefused:
				note(ds[i].Reject(false))
			}
		case ActionRequeue:
			if crashed && (decs[i].Class == ClassPanic || decs[i].Class == classBehindPanic) {
				continue
			}
			note(w.requeue(session, ds[i], decs[i].Class))
		}
	}
	if ackUpTo != nil {
		note(ackUpTo.Ack(true)) // multiple: every unsettled delivery up to this one
	}
	return first
}

// errPanicInBatch ends the broker session after a panic in a batch, so
// that the broker returns the messages left in hand, in order.
var errPanicInBatch = errors.New("a message of the batch panicked: returning it and those behind it, in order")

// widen goes back to batches once a message passed after a panic.
func (w *worker) widen() error {
	if err := w.ch.Qos(w.svc.cfg.BatchMax, 0, false); err != nil {
		return fmt.Errorf("prefetch %d: %w", w.svc.cfg.BatchMax, err)
	}
	w.narrow = false
	w.svc.setNarrow(w.queue, false)
	return nil
}
