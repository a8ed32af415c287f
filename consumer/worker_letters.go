package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"transferconsumer/dlq"
	"transferconsumer/event"
)

// copy publishes a copy of s with the failure headers to the dead-letter
// exchange and waits for the broker's confirm, and reports what became of
// it; the core decides what follows (core.copied). Unless force, nothing
// is published while a broker alarm blocks publishing (factAlarm), and an
// alarm that starts while the confirm is awaited cuts the wait short
// (factCut): the publish's answer is kept. With answer, the core asks for
// that answer instead: whether it has come (factAnswered, with it) or not
// yet (factUnanswered).
func (w *worker) copy(s *inHand, force, answer bool) (copyFact, error) {
	h := w.inFlight[s.Tag]
	if answer {
		select {
		case err := <-h.abandoned:
			h.abandoned = nil
			return factAnswered, err
		default:
			return factUnanswered, nil
		}
	}
	if !force && w.letters.alarmed() {
		return factAlarm, nil
	}
	msg := dlq.Copy(h.d, dlq.Failure{
		Class:    string(s.Class),
		Reason:   s.Err.Error(),
		Queue:    w.queue,
		Instance: w.svc.cfg.Instance,
		At:       w.now(),
	})
	err := w.letters.publish(w.session, dlq.Exchange(w.svc.cfg.Topology.Prefix), h.d.RoutingKey, msg, force)
	switch {
	case err == nil:
		return factConfirmed, nil
	case w.session.Err() != nil:
		w.svc.log.Warn("the session ended before the dead-letter copy was confirmed",
			"queue", w.queue, "event_id", w.eventID(s))
		return factEnded, err
	case errors.Is(err, errAlarmCut):
		if cut, ok := errors.AsType[*alarmCut](err); ok {
			h.abandoned = cut.answer // the parked letter waits for it
			return factCut, err
		}
		return factAlarm, err // the dead-letter channel could not open: nothing was sent
	}
	say := "dead-letter copy not confirmed"
	if _, refused := errors.AsType[*dlq.Refused](err); refused {
		say = "dead-letter copy refused by the broker (access refused)"
	}
	w.svc.log.Error(say, "queue", w.queue, "event_id", w.eventID(s), "err", err)
	return factRefused, err
}

// park writes s's dead letter to the database for the outbox drain to
// publish once the alarm passes; the core then has the message acked.
func (w *worker) park(s *inHand) (copyFact, error) {
	ctx, cancel := context.WithTimeout(w.work, w.svc.cfg.ApplyTimeout)
	defer cancel()
	h := w.inFlight[s.Tag]
	typ := s.Event.Type
	if typ == "" {
		typ = h.d.Type
	}
	letter := event.OutboxLetter{
		EventID: w.eventID(s), EventType: typ, Class: string(s.Class), Reason: s.Err.Error(),
		RoutingKey: h.d.RoutingKey, MessageID: h.d.MessageId, ContentType: h.d.ContentType,
		Body: h.d.Body, Headers: event.HeadersJSON(h.d.Headers), Queue: w.queue, At: w.now(),
		Abandoned: h.abandoned,
	}
	var err error
	if pl, ok := w.lane.(parkingLane); ok {
		// Journaled with the queue's mark: the ack waits for its entry.
		if err = pl.Park(ctx, letter); err == nil {
			w.awaitJournal()
		}
	} else {
		err = w.parker.Park(ctx, letter)
	}
	if err != nil {
		return factParkFailed, fmt.Errorf("park a dead letter during a broker alarm: %w", err)
	}
	w.svc.log.Warn("a broker alarm holds dead letters back: parked this one in the database, to be published when it passes",
		"queue", w.queue, "event_id", w.eventID(s), "class", string(s.Class))
	return factParked, nil
}

// logDecision logs one decision about a delivery, at its level.
func (s *Service) logDecision(dec Decision, sendErr error) {
	level := slog.LevelInfo
	switch {
	case sendErr != nil || dec.Action == ActionDeadLetter || dec.Class == event.ClassPanic:
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
