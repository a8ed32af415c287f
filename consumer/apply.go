package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"transferconsumer/event"
)

// apply makes one attempt at the events of the deliveries hand, in one transaction,
// within ApplyTimeout and while work lasts: one event through Apply,
// several through the lane's ApplyBatch (the core gives several only to a
// lane that batches). A panic is recovered as ClassPanic, logged with its
// stack, and the lane, which it may have left inside a transaction, is
// replaced.
func (w *worker) apply(hand []*inHand) (outs []event.Outcome, err error) {
	evs := make([]event.Event, len(hand))
	for i, s := range hand {
		evs[i] = s.Event
	}
	if w.svc.cfg.ObserveBatch != nil && w.svc.cfg.BatchMax > 1 {
		w.svc.cfg.ObserveBatch(len(evs))
	}
	w.traceID, w.traced = "", nil
	if h := w.inFlight[hand[0].Tag]; h != nil {
		w.traceID = traceID(h.span, h.d.Headers)
		if h.span != nil {
			w.traced = trace.ContextWithSpan(context.Background(), h.span)
		}
	}
	defer func() {
		if p := recover(); p != nil {
			outs, err = nil, w.panicked(evs[0].ID, p)
		}
	}()
	if len(evs) == 1 {
		res, err := w.attempt(evs[0])
		if err != nil {
			return nil, err
		}
		return []event.Outcome{{Result: res}}, nil
	}
	bl := w.lane.(BatchLane)
	err = w.inSpan(func() (err error) {
		outs, err = bl.ApplyBatch(w.work, evs)
		return w.whyCancelled(err)
	}, attribute.Int("messaging.batch.message_count", len(evs)))
	return outs, err
}

func (w *worker) tracedContext() context.Context {
	if w.traced != nil {
		return w.traced
	}
	return context.Background()
}

// inSpan runs do, the one transaction of an attempt, one event's or a
// batch's, inside an apply_event span with attrs when a tracer is set, and
// marks the span failed with do's error. The span is ended when do
// returns, not deferred: a panic in do leaves it unended, and apply
// recovers and logs the panic.
func (w *worker) inSpan(do func() error, attrs ...attribute.KeyValue) error {
	t := w.svc.cfg.Tracer
	if t == nil {
		return do()
	}
	span := startTransaction(t, w.tracedContext())
	span.SetAttributes(attrs...)
	err := do()
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	return err
}

// attempt applies ev once, within ApplyTimeout and while work lasts.
func (w *worker) attempt(ev event.Event) (res event.Result, err error) {
	err = w.inSpan(func() (err error) {
		res, err = w.attemptOnce(ev)
		return err
	})
	return res, err
}

func (w *worker) attemptOnce(ev event.Event) (event.Result, error) {
	if w.lane != nil {
		res, err := w.lane.Apply(w.work, ev) // the lane keeps the timeout itself
		return res, w.whyCancelled(err)
	}
	ctx, cancel := context.WithTimeout(w.work, w.svc.cfg.ApplyTimeout)
	defer cancel()
	res, err := w.svc.app.Apply(ctx, ev)
	return res, w.whyCancelled(err)
}

// whyCancelled adds to err, when the work in hand was cancelled, why: an attempt
// that shutdown cut short is classified as such from its own error,
// whatever the session's state when the error is looked at.
func (w *worker) whyCancelled(err error) error {
	if err == nil || w.work.Err() == nil {
		return err
	}
	return fmt.Errorf("%w (%w)", err, context.Cause(w.work))
}

// panicked logs a recovered panic with its stack and returns it as a
// ClassPanic error; the lane, which it may have left inside a transaction,
// is replaced.
func (w *worker) panicked(eventID string, p any) error {
	if w.svc.log.Enabled(context.Background(), slog.LevelError) { // the stack is dear to take
		w.svc.log.Error("panic while handling a message; it is retried in place",
			"queue", w.queue, "event_id", eventID, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	}
	w.renewLane()
	return event.Panicked(fmt.Errorf("panic: %v", p))
}

// renewLane replaces the worker's lane after a panic. A lane that wraps
// another (the journal's) replaces only what it wraps, and keeps what it
// knows.
func (w *worker) renewLane() {
	if w.lane == nil {
		return
	}
	lanes := w.svc.app.(Lanes)
	if r, ok := w.lane.(renewer); ok {
		r.Renew(lanes.Lane(w.svc.cfg.ApplyTimeout))
		return
	}
	w.lane.Close()
	w.lane = w.svc.lane(lanes, w.queue)
}

// renewer is a lane that wraps another (the journal package's Lane).
type renewer interface {
	Renew(inner event.Lane)
}

func (w *worker) close() {
	if w.lane != nil {
		w.lane.Close()
	}
}
