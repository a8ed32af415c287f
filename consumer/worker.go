package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
)

// worker consumes one queue on its own channel; channels are not safe for
// concurrent use, so nothing else touches ch or pub.
type worker struct {
	svc        *Service
	queue, tag string
	ch, pub    *amqp.Channel
	returns    <-chan amqp.Return
	deliveries <-chan amqp.Delivery
	work       context.Context // lives ShutdownTimeout past shutdown
	lane       Lane            // when the applier has lanes; else each attempt gets a timeout context
	// publish sends a dead-letter copy and returns nil only once the broker
	// confirmed it; publishConfirmed, or a fake in unit tests.
	publish func(exchange, key string, msg amqp.Publishing) error
}

// run handles deliveries until session ends or the channel fails. When
// session ends it cancels the consumer and finishes what the broker already
// sent (with prefetch 1, at most one message): returning it instead would
// count toward its delivery limit.
func (w *worker) run(session context.Context) error {
	for {
		select {
		case d, ok := <-w.deliveries:
			if !ok {
				return fmt.Errorf("queue %s: consumer channel closed", w.queue)
			}
			if err := w.handle(session, d); err != nil {
				return err
			}
		case <-session.Done():
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
	}
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
	ev, err := Decode(d.Body, d.MessageId, d.Type)
	if err == nil {
		dec.EventID = ev.ID
		var res Result
		res, dec.Retries, err = w.apply(session, ev)
		dec.Duplicate = res.Duplicate
	}
	dec.Err = err
	dec.Class = ClassOf(session, err)
	dec.Action = decide(dec.Class)

	var sendErr error
	switch dec.Action {
	case ActionAck:
		sendErr = d.Ack(false)
	case ActionDeadLetter:
		sendErr = w.deadLetter(d, dec)
	case ActionRequeue:
		// Reject, not Nack: on every broker version (4.3+ included) a
		// rejected requeue counts toward the quorum queue's delivery limit.
		sendErr = d.Reject(true)
	}
	dec.Duration = time.Since(start)
	w.log(dec, sendErr)
	if w.svc.cfg.Observe != nil {
		w.svc.cfg.Observe(dec)
	}
	if sendErr != nil {
		return fmt.Errorf("queue %s: %s event %s: %w", w.queue, dec.Action, dec.EventID, sendErr)
	}
	return nil
}

// apply applies ev, retrying transient failures in place with backoff for as
// long as they last: the message stays in hand, so the queue waits in order
// and the message's delivery count is not burnt. It gives up only when
// session ends (shutdown or a broken broker session).
func (w *worker) apply(session context.Context, ev Event) (Result, int, error) {
	for attempt := 0; ; attempt++ {
		res, err := w.attempt(ev)
		if err == nil || ClassOf(session, err) != ClassTransient {
			return res, attempt, err
		}
		delay := w.svc.cfg.Retry.Delay(attempt)
		w.svc.log.Warn("transient failure, retrying in place",
			"queue", w.queue, "event_id", ev.ID, "attempt", attempt+1, "delay", delay, "err", err)
		if w.svc.cfg.ObserveRetry != nil {
			w.svc.cfg.ObserveRetry(Retry{Queue: w.queue, EventID: ev.ID, Attempt: attempt + 1, Delay: delay, Err: err})
		}
		select {
		case <-session.Done():
			return res, attempt, err
		case <-time.After(delay):
		}
	}
}

// attempt applies ev once, within ApplyTimeout and while work lasts.
func (w *worker) attempt(ev Event) (Result, error) {
	if w.lane != nil {
		return w.lane.Apply(w.work, ev) // the lane keeps the timeout itself
	}
	ctx, cancel := context.WithTimeout(w.work, w.svc.cfg.ApplyTimeout)
	defer cancel()
	return w.svc.app.Apply(ctx, ev)
}

func (w *worker) close() {
	if w.lane != nil {
		w.lane.Close()
	}
}

// deadLetter publishes a copy of d with the failure headers to the
// dead-letter exchange, waits for the broker's confirm, and only then acks d.
// If the copy cannot be confirmed, d is rejected without requeue, and the
// queue's at-least-once dead-lettering keeps it: either way it is not lost.
func (w *worker) deadLetter(d amqp.Delivery, dec Decision) error {
	msg := dlq.Copy(d, dlq.Failure{
		Class:    string(dec.Class),
		Reason:   dec.Err.Error(),
		Queue:    w.queue,
		Instance: w.svc.cfg.Instance,
		At:       time.Now(),
	})
	if err := w.publish(dlq.Exchange(w.svc.cfg.Topology.Prefix), d.RoutingKey, msg); err != nil {
		w.svc.log.Error("dead-letter copy not confirmed, rejecting to the broker's dead-lettering",
			"queue", w.queue, "event_id", dec.EventID, "err", err)
		return d.Reject(false)
	}
	return d.Ack(false)
}

func (w *worker) publishConfirmed(exchange, key string, msg amqp.Publishing) error {
	ctx, cancel := context.WithTimeout(w.work, 30*time.Second)
	defer cancel()
	return dlq.PublishConfirmed(ctx, w.pub, w.returns, exchange, key, msg)
}

func (w *worker) log(dec Decision, sendErr error) {
	level := slog.LevelInfo
	switch {
	case sendErr != nil || dec.Action == ActionDeadLetter:
		level = slog.LevelError
	case dec.Action == ActionRequeue:
		level = slog.LevelWarn
	}
	outcome := "applied"
	switch {
	case dec.Duplicate:
		outcome = "duplicate"
	case dec.Action != ActionAck:
		outcome = string(dec.Action)
	}
	// The record goes straight to the handler: Logger.Log would also look
	// up its caller's source line (a stack walk) and box every value, work
	// done on every event for nothing this line uses.
	h := w.svc.log.Handler()
	ctx := context.Background()
	if !h.Enabled(ctx, level) {
		return
	}
	r := slog.NewRecord(time.Now(), level, "event", 0)
	r.AddAttrs(
		slog.String("event_id", dec.EventID), slog.String("queue", dec.Queue),
		slog.Bool("redelivered", dec.Redelivered), slog.Int64("delivery_count", dec.DeliveryCount),
		slog.String("outcome", outcome),
		// Microseconds as an integer: slog's JSON handler writes a float
		// through encoding/json, a measurable cost on every event.
		slog.Int64("duration_us", dec.Duration.Microseconds()),
	)
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
