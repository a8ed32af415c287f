package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"transferconsumer/dlq"
)

// worker consumes one queue on its own channel; channels are not safe for
// concurrent use, so nothing else touches ch or pub.
type worker struct {
	svc        *Service
	queue, tag string
	ch         *amqp.Channel
	closed     <-chan *amqp.Error // ch's close notification
	deliveries <-chan amqp.Delivery
	work       context.Context // lives ShutdownTimeout past shutdown
	lane       Lane            // when the applier has lanes; else each attempt gets a timeout context
	letters    *letters        // the connection dead-letter copies go out on
	pub        *amqp.Channel   // on letters' connection, opened at the first dead letter
	returns    <-chan amqp.Return
	// publish sends a dead-letter copy and returns nil only once the broker
	// confirmed it; publishConfirmed, or a fake in unit tests.
	publish func(exchange, key string, msg amqp.Publishing) error
	// traced is the delivery in hand's span context, when tracing is on;
	// traceID its trace, for log lines.
	traced  context.Context
	traceID string
}

// run handles deliveries until session ends or the channel fails. When
// session ends it cancels the consumer and finishes what the broker already
// sent (with prefetch 1, at most one message): returning it instead would
// count toward its delivery limit.
func (w *worker) run(session context.Context) error {
	for session.Err() == nil { // an ended session goes first, even with a delivery waiting
		select {
		case d, ok := <-w.deliveries:
			if !ok {
				var reason *amqp.Error
				select {
				case reason = <-w.closed:
				default:
				}
				return fmt.Errorf("queue %s: consumer channel closed: %v", w.queue, reason)
			}
			if err := w.handle(session, d); err != nil {
				return err
			}
		case <-session.Done():
		}
	}
	if err := w.ch.Cancel(w.tag, false); err != nil {
		return nil // the channel is gone; the broker returns what it held
	}
	for d := range w.deliveries {
		if err := w.handle(session, d); err != nil {
			return err
		}
	}
	return nil
}

// handle decides the fate of one delivery and carries it out: ack after the
// commit (or for a duplicate), dead-letter, or requeue. It returns an error
// only when the channel could not carry the decision out; the broker then
// redelivers the message, which the inbox makes harmless.
func (w *worker) handle(session context.Context, d amqp.Delivery) error {
	start := time.Now()
	dec := Decision{
		Queue:         w.queue,
		EventID:       d.MessageId,
		Redelivered:   d.Redelivered,
		DeliveryCount: dlq.DeliveryCount(d.Headers),
	}
	var span trace.Span
	if t := w.svc.cfg.Tracer; t != nil {
		w.traced, span = w.startDelivery(t, d)
		defer func() { endDelivery(span, dec) }()
	}
	dec.TraceID = traceID(span, d.Headers)
	w.traceID = dec.TraceID
	var err error
	var res Result
	dec.EventID, dec.EventType, res, dec.Retries, err = w.process(session, d)
	dec.Duplicate = res.Duplicate
	dec.Err = err
	dec.Class = ClassOf(session, err)
	dec.Action = decide(dec.Class)
	if dec.Action == ActionRetry {
		// Retrying in place ends only when the broker session does (a
		// closed channel or connection, while not shutting down): the
		// broker has the message back, or gets it with this requeue.
		dec.Action = ActionRequeue
	}

	var sendErr error
	switch dec.Action {
	case ActionAck:
		sendErr = d.Ack(false)
	case ActionDeadLetter:
		dec.Action, sendErr = w.deadLetter(d, dec)
	case ActionRequeue:
		if session.Err() != nil && w.ch != nil { // (unit tests have no channel)
			// Cancel first, or the broker hands the message straight back
			// to this consumer, and returning it again spends another of
			// its deliveries. The broker takes the two in order.
			_ = w.ch.Cancel(w.tag, false)
		}
		if dec.Class == ClassPanic {
			// Reject: on every broker version (4.3+ included) a rejected
			// requeue counts toward the quorum queue's delivery limit,
			// which is what ends a crash loop.
			sendErr = d.Reject(true)
		} else {
			// Shutdown, or a broker session that ended while the
			// environment failed: not the message's doing. From 4.3 a
			// nacked requeue does not count toward the delivery limit;
			// before, both count the same.
			sendErr = d.Nack(false, true)
		}
	}
	dec.Duration = time.Since(start)
	w.svc.logDecision(dec, sendErr)
	if w.svc.cfg.Observe != nil {
		w.svc.cfg.Observe(dec)
	}
	if sendErr != nil {
		return fmt.Errorf("queue %s: %s event %s: %w", w.queue, dec.Action, dec.EventID, sendErr)
	}
	if res.Outbox {
		// The commit left a dead letter (a transition that waited for this
		// creation contradicts it): publish it now; the drain loop picks
		// it up if this fails.
		w.svc.drainOutbox(w.work, w.queue, w.publish)
	}
	return nil
}

// process decodes d and applies it, retrying in place what the environment
// caused. A panic in either is recovered and returned as ClassPanic with its
// stack, so that the message is requeued and the delivery limit, not a
// dead process, ends a loop of them.
func (w *worker) process(session context.Context, d amqp.Delivery) (id, typ string, res Result, retries int, err error) {
	id, typ = d.MessageId, d.Type
	defer func() {
		if p := recover(); p != nil {
			stack := debug.Stack()
			w.svc.log.Error("panic while handling a message; it is requeued, and the delivery limit ends a loop",
				"queue", w.queue, "event_id", id, "panic", fmt.Sprint(p), "stack", string(stack))
			err = &classified{class: ClassPanic, err: fmt.Errorf("panic: %v", p)}
			w.renewLane()
		}
	}()
	ev, err := Decode(d.Body, d.MessageId, d.Type)
	if ev.ID != "" { // the body's, which is authoritative, even when it is poison
		id = ev.ID
	}
	if ev.Type != "" {
		typ = ev.Type
	}
	if err != nil {
		return id, typ, Result{}, 0, err
	}
	ev.Message = Message{RoutingKey: d.RoutingKey, Body: d.Body, Headers: d.Headers,
		MessageID: d.MessageId, ContentType: d.ContentType}
	res, retries, err = w.apply(session, ev)
	return id, typ, res, retries, err
}

// apply applies ev, retrying in place with backoff, for as long as it
// lasts, whatever the environment caused and whatever nobody classified:
// the message stays in hand, so the queue waits in order and the message's
// delivery count is not spent. The queue is reported blocked meanwhile. It
// gives up only when session ends (shutdown, or a broken broker session)
// or the broker closes the channel (the broker then has the message back).
func (w *worker) apply(session context.Context, ev Event) (Result, int, error) {
	b := Blocked{Queue: w.queue, EventID: ev.ID, TraceID: w.traceID}
	var th Throttle
	for attempt := 0; ; attempt++ {
		res, err := w.attempt(ev)
		class := ClassOf(session, err)
		if decide(class) != ActionRetry {
			if b.Attempts > 0 {
				w.svc.clearBlocked(w.queue)
			}
			if b.Attempts > 0 && class != ClassShutdown {
				w.svc.log.Info("queue unblocked", "queue", w.queue, "event_id", ev.ID, "attempts", b.Attempts,
					"blocked_ms", time.Since(b.Since).Milliseconds())
			}
			return res, attempt, err
		}
		if b.Attempts == 0 {
			b.Since = time.Now()
		}
		b.Attempts, b.Class, b.Reason = attempt+1, class, err.Error()
		w.svc.setBlocked(b)
		delay := w.svc.cfg.Retry.Delay(attempt)
		logBlocked(w.svc.log, &th, b, delay)
		if w.svc.cfg.ObserveRetry != nil {
			w.svc.cfg.ObserveRetry(Retry{Queue: w.queue, EventID: ev.ID, Attempt: attempt + 1, Delay: delay, Err: err})
		}
		select {
		case <-session.Done():
			return res, attempt, err // the queue stays reported blocked until the next session resumes it
		case e := <-w.closed:
			return res, attempt, fmt.Errorf("%w; the broker closed the channel meanwhile: %v", err, e)
		case <-time.After(delay):
		}
	}
}

// attempt applies ev once, within ApplyTimeout and while work lasts.
func (w *worker) attempt(ev Event) (Result, error) {
	if t := w.svc.cfg.Tracer; t != nil {
		span := startTransaction(t, w.traced)
		res, err := w.attemptOnce(ev)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
		return res, err
	}
	return w.attemptOnce(ev)
}

func (w *worker) attemptOnce(ev Event) (Result, error) {
	if w.lane != nil {
		return w.lane.Apply(w.work, ev) // the lane keeps the timeout itself
	}
	ctx, cancel := context.WithTimeout(w.work, w.svc.cfg.ApplyTimeout)
	defer cancel()
	return w.svc.app.Apply(ctx, ev)
}

// renewLane replaces the worker's lane after a panic, which may have left
// it in the middle of a transaction.
func (w *worker) renewLane() {
	if w.lane == nil {
		return
	}
	w.lane.Close()
	w.lane = w.svc.app.(Lanes).Lane(w.svc.cfg.ApplyTimeout)
}

func (w *worker) close() {
	if w.lane != nil {
		w.lane.Close()
	}
}

// deadLetter publishes a copy of d with the failure headers to the
// dead-letter exchange, waits for the broker's confirm, and only then acks d.
// The wait has no limit of its own: under a resource alarm the broker
// confirms once the alarm passes, and this queue waits meanwhile. If the
// copy is refused (nack, unroutable, its connection lost), d is rejected
// without requeue, and the queue's at-least-once dead-lettering keeps it;
// if shutdown cuts the wait short, d is requeued. Either way nothing is
// lost, and at worst the DLQ holds a letter twice. It returns what it did.
func (w *worker) deadLetter(d amqp.Delivery, dec Decision) (Action, error) {
	msg := dlq.Copy(d, dlq.Failure{
		Class:    string(dec.Class),
		Reason:   dec.Err.Error(),
		Queue:    w.queue,
		Instance: w.svc.cfg.Instance,
		At:       time.Now(),
	})
	err := w.publish(dlq.Exchange(w.svc.cfg.Topology.Prefix), d.RoutingKey, msg)
	switch {
	case err == nil:
		return ActionDeadLetter, d.Ack(false)
	case errors.Is(context.Cause(w.work), ErrShutdown):
		w.svc.log.Warn("shutdown before the dead-letter copy was confirmed; requeued",
			"queue", w.queue, "event_id", dec.EventID)
		return ActionRequeue, d.Nack(false, true)
	}
	w.svc.log.Error("dead-letter copy not confirmed, rejecting to the broker's dead-lettering",
		"queue", w.queue, "event_id", dec.EventID, "err", err)
	return ActionDeadLetter, d.Reject(false)
}

func (w *worker) publishConfirmed(exchange, key string, msg amqp.Publishing) error {
	if w.pub == nil || w.pub.IsClosed() {
		var err error
		if w.pub, w.returns, err = w.letters.channel(); err != nil {
			return err
		}
	}
	return dlq.PublishConfirmed(w.work, w.pub, w.returns, exchange, key, msg)
}

// logDecision logs one decision about a delivery, at its level.
func (s *Service) logDecision(dec Decision, sendErr error) {
	level := slog.LevelInfo
	switch {
	case sendErr != nil || dec.Action == ActionDeadLetter || dec.Class == ClassPanic:
		level = slog.LevelError
	case dec.Action == ActionRequeue:
		level = slog.LevelWarn
	}
	// The record goes straight to the handler: Logger.Log would also look
	// up its caller's source line (a stack walk) and box every value, work
	// done on every event for nothing this line uses.
	h := s.log.Handler()
	ctx := context.Background()
	if !h.Enabled(ctx, level) {
		return
	}
	r := slog.NewRecord(time.Now(), level, "event", 0)
	r.AddAttrs(
		slog.String("event_id", dec.EventID), slog.String("queue", dec.Queue),
		slog.Bool("redelivered", dec.Redelivered), slog.Int64("delivery_count", dec.DeliveryCount),
		slog.String("outcome", dec.Outcome()),
		// Microseconds as an integer: slog's JSON handler writes a float
		// through encoding/json, a measurable cost on every event.
		slog.Int64("duration_us", dec.Duration.Microseconds()),
	)
	if dec.EventType != "" {
		r.AddAttrs(slog.String("event_type", dec.EventType))
	}
	if dec.TraceID != "" {
		r.AddAttrs(slog.String("trace_id", dec.TraceID))
	}
	if dec.Class != "" {
		r.AddAttrs(slog.String("class", string(dec.Class)), slog.Any("err", dec.Err))
	}
	if dec.Retries > 0 {
		r.AddAttrs(slog.Int("retries", dec.Retries))
	}
	if sendErr != nil {
		r.AddAttrs(slog.Any("send_err", sendErr))
	}
	h.Handle(ctx, r)
}
