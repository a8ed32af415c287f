package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	letters    letterChannel   // where dead-letter copies go out
	// publish sends a dead-letter copy and returns nil only once the broker
	// confirmed it; publishConfirmed, or a fake in unit tests.
	publish func(exchange, key string, msg amqp.Publishing) error
	// traced is the delivery in hand's span context, when tracing is on;
	// traceID its trace, for log lines.
	traced  context.Context
	traceID string
	// cancelled: the consumer was cancelled because the session ended.
	cancelled bool
	// narrow: after a panic in a batch, the worker takes one message at a
	// time (prefetch 1) until one passes (see batch.go).
	narrow bool
	batch  []amqp.Delivery // reused by collect
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
			if err := w.take(session, d); err != nil {
				return err
			}
		case <-session.Done():
		}
	}
	if !w.cancelled {
		if err := w.ch.Cancel(w.tag, false); err != nil {
			return nil // the channel is gone; the broker returns what it held
		}
		w.cancelled = true
	}
	for d := range w.deliveries {
		if err := w.take(session, d); err != nil {
			return err
		}
	}
	return nil
}

// take handles d: alone, or, with BatchMax above 1, in a batch with what
// else has arrived.
func (w *worker) take(session context.Context, d amqp.Delivery) error {
	if w.svc.cfg.BatchMax <= 1 {
		return w.handle(session, d)
	}
	batch, _ := w.collect(d) // a closed channel shows at the next receive
	if w.svc.cfg.ObserveBatch != nil {
		w.svc.cfg.ObserveBatch(len(batch))
	}
	return w.handleBatch(session, batch)
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
		switch w.copyToDLQ(d, dec) {
		case copied:
			sendErr = d.Ack(false)
		case copyCut:
			dec.Action, sendErr = ActionRequeue, d.Nack(false, true)
		case copyRefused:
			sendErr = d.Reject(false)
		}
	case ActionRequeue:
		sendErr = w.requeue(session, d, dec.Class)
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
			err = w.panicked(id, p)
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
	var res Result
	retries, err := w.retryInPlace(session, ev.ID, func() (err error) {
		res, err = w.attempt(ev)
		return err
	})
	return res, retries, err
}

// retryInPlace runs attempt, and again after a backoff for as long as it
// fails for a reason the environment caused or nobody classified (apply
// says why); eventID names what is retried in the blocked state and the
// logs. It returns the retries made and attempt's last error.
func (w *worker) retryInPlace(session context.Context, eventID string, attempt func() error) (int, error) {
	b := Blocked{Queue: w.queue, EventID: eventID, TraceID: w.traceID}
	var th Throttle
	for n := 0; ; n++ {
		err := attempt()
		class := ClassOf(session, err)
		if decide(class) != ActionRetry {
			if b.Attempts > 0 {
				w.svc.clearBlocked(w.queue)
			}
			if b.Attempts > 0 && class != ClassShutdown {
				w.svc.log.Info("queue unblocked", "queue", w.queue, "event_id", eventID, "attempts", b.Attempts,
					"blocked_ms", time.Since(b.Since).Milliseconds())
			}
			return n, err
		}
		if b.Attempts == 0 {
			b.Since = time.Now()
		}
		b.Attempts, b.Class, b.Reason = n+1, class, err.Error()
		w.svc.setBlocked(b)
		delay := w.svc.cfg.Retry.Delay(n)
		logBlocked(w.svc.log, &th, b, delay)
		if w.svc.cfg.ObserveRetry != nil {
			w.svc.cfg.ObserveRetry(Retry{Queue: w.queue, EventID: eventID, Attempt: n + 1, Delay: delay, Err: err})
		}
		select {
		case <-session.Done():
			return n, err // the queue stays reported blocked until the next session resumes it
		case e := <-w.closed:
			return n, fmt.Errorf("%w; the broker closed the channel meanwhile: %v", err, e)
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

// copyFate is what became of a dead letter's copy, and so of the original.
type copyFate int

const (
	copied      copyFate = iota // confirmed: ack the original
	copyCut                     // shutdown cut the wait: requeue the original
	copyRefused                 // nacked, unroutable, connection lost: reject the original without requeue
)

// copyToDLQ publishes a copy of d with the failure headers to the
// dead-letter exchange and waits for the broker's confirm. The wait has no
// limit of its own: under a resource alarm the broker confirms once the
// alarm passes, and this queue waits meanwhile. The caller then acks d; or,
// if the copy was refused, rejects it without requeue, so that the queue's
// at-least-once dead-lettering keeps it; or, if shutdown cut the wait,
// requeues it. Either way nothing is lost, and at worst the DLQ holds a
// letter twice.
func (w *worker) copyToDLQ(d amqp.Delivery, dec Decision) copyFate {
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
		return copied
	case errors.Is(context.Cause(w.work), ErrShutdown):
		w.svc.log.Warn("shutdown before the dead-letter copy was confirmed; requeued",
			"queue", w.queue, "event_id", dec.EventID)
		return copyCut
	}
	w.svc.log.Error("dead-letter copy not confirmed, rejecting to the broker's dead-lettering",
		"queue", w.queue, "event_id", dec.EventID, "err", err)
	return copyRefused
}

// requeue returns d to its queue. After a broker session ended, the
// consumer is cancelled first, or the broker hands the message straight
// back to this consumer, and returning it again spends another of its
// deliveries (the broker takes the two in order). A panic is returned with
// Reject, which every broker version counts toward the quorum queue's
// delivery limit: that ends a crash loop. Anything else (shutdown, a broker
// session that ended while the environment failed) is not the message's
// doing and is returned with Nack, which from RabbitMQ 4.3 does not count
// (before, both count the same).
func (w *worker) requeue(session context.Context, d amqp.Delivery, class Class) error {
	if session.Err() != nil && w.ch != nil && !w.cancelled { // (unit tests have no channel)
		_ = w.ch.Cancel(w.tag, false)
		w.cancelled = true
	}
	if class == ClassPanic {
		return d.Reject(true)
	}
	return d.Nack(false, true)
}

func (w *worker) publishConfirmed(exchange, key string, msg amqp.Publishing) error {
	return w.letters.publish(w.work, exchange, key, msg)
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
