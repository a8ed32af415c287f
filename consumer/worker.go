package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
	"transferconsumer/retry"
)

// worker consumes one queue on its own channel: the thin shell around the
// queue's core (core.go). It turns deliveries, results and the session's
// end into the core's inputs, and the core's commands into amqp091 and
// applier calls. Channels are not safe for concurrent use, so nothing else
// touches ch.
type worker struct {
	svc        *Service
	index      int
	queue, tag string
	conn       *amqp.Connection
	ch         *amqp.Channel
	closed     <-chan *amqp.Error // ch's close notification
	deliveries <-chan amqp.Delivery
	work       context.Context // lives ShutdownTimeout past shutdown
	lane       Lane            // when the applier has lanes; else each attempt gets a timeout context
	letters    letterChannel   // where dead-letter copies go out
	// publish sends a dead-letter copy and returns nil only once the broker
	// confirmed it, waiting as long as ctx lasts; letters.publish, or a
	// fake in unit tests.
	publish func(ctx context.Context, exchange, key string, msg amqp.Publishing) error
	core    *core
	// traced is the first delivery of the attempt under way's span
	// context, when tracing is on; traceID its trace, for log lines.
	traced  context.Context
	traceID string
	blocked Blocked        // while the core retries in place
	th      retry.Throttle // when to log a blocked queue
}

// run carries out the core's commands until it is finished: the session
// ended and what was in hand is settled or returned, or the channel closed.
// It returns an error when the channel failed or the broker cancelled the
// consumer, so that the session ends and consumes again.
func (w *worker) run(session context.Context) error {
	var failed error
	ended := session.Done()
	var timer *time.Timer
	var timerC <-chan time.Time
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if ended != nil && session.Err() != nil {
			// An ended session goes first, even with deliveries waiting.
			ended = nil
			w.core.end()
		}
		cmd := w.core.next()
		switch cmd.Kind {
		case cmdDone:
			return failed
		case cmdNone:
		case cmdWait:
			delay := w.svc.cfg.BatchLinger
			if !cmd.Linger {
				delay = w.svc.cfg.Retry.Delay(cmd.Attempt)
				w.reportBlocked(cmd.Attempt, delay)
			}
			if timer != nil {
				timer.Stop()
			}
			timer = time.NewTimer(delay)
			timerC = timer.C
		default:
			if err := w.exec(session, cmd); err != nil {
				if failed == nil {
					failed = err
				}
				w.core.channelClosed() // a channel that failed a command is closed by the broker
			}
			continue
		}
		select {
		case d, ok := <-w.deliveries:
			if !ok {
				// The channel closed, or the broker cancelled the consumer
				// (a consumer timeout on 4.3, a deleted queue).
				var reason *amqp.Error
				select {
				case reason = <-w.closed:
				default:
				}
				if reason != nil || w.ch.IsClosed() {
					w.core.channelClosed()
					if failed == nil {
						failed = fmt.Errorf("queue %s: consumer channel closed: %v", w.queue, reason)
					}
				} else {
					w.core.cancelled()
					if failed == nil {
						failed = fmt.Errorf("queue %s: the broker cancelled the consumer", w.queue)
					}
				}
				w.deliveries = nil
				continue
			}
			w.take(d)
			w.gather()
		case <-timerC:
			timerC = nil
			w.core.tick()
		case <-ended:
			ended = nil
			w.core.end()
		case e := <-w.closed:
			w.closed = nil
			w.core.channelClosed()
			if failed == nil {
				failed = fmt.Errorf("queue %s: channel closed: %v", w.queue, e)
			}
		}
	}
}

// gather takes in hand what else has already arrived, so that a batch
// holds it. A delivery that has arrived may still be on its way through
// the client's buffering goroutine: it is let run once.
func (w *worker) gather() {
	if w.core.max <= 1 {
		return
	}
	for yielded := false; ; {
		select {
		case d, ok := <-w.deliveries:
			if !ok {
				return // seen again at the next receive
			}
			w.take(d)
			yielded = false
			continue
		default:
		}
		if yielded {
			return
		}
		runtime.Gosched()
		yielded = true
	}
}

// take decodes d and hands it to the core. A panic while decoding is
// recovered as ClassPanic: the message is returned, and the delivery limit
// ends a loop of them.
func (w *worker) take(d amqp.Delivery) {
	s := &slot{Tag: d.DeliveryTag, d: d, start: time.Now()}
	if t := w.svc.cfg.Tracer; t != nil {
		_, s.span = w.startDelivery(t, d)
	}
	if max := w.svc.cfg.MaxBodyBytes; max > 0 && len(d.Body) > max {
		s.Err = Poison(fmt.Errorf("body of %d bytes is over MAX_BODY_BYTES (%d): not decoded", len(d.Body), max))
	} else {
		s.Event, s.Err = w.decode(d)
	}
	s.Class = ClassOf(context.Background(), s.Err)
	w.core.deliver(s)
}

// decode decodes d; a panic is a ClassPanic error.
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

// exec carries out one command and feeds its result back to the core. It
// returns an error when the channel could not carry a settlement out; the
// broker then has the message back, which the inbox makes harmless.
func (w *worker) exec(session context.Context, cmd command) error {
	switch cmd.Kind {
	case cmdApply:
		outs, err := w.apply(session, cmd.Slots)
		w.core.applied(outs, err, ClassOf(session, err))
		w.unblock()
	case cmdCopy:
		r, err := w.copy(session, cmd.Slots[0])
		w.core.copied(r, err)
		w.unblock()
	case cmdAck:
		err := cmd.Slots[len(cmd.Slots)-1].d.Ack(cmd.Multiple)
		w.settled(cmd.Slots, ActionAck, err)
		if err != nil {
			return fmt.Errorf("queue %s: ack event %s: %w", w.queue, eventID(cmd.Slots[0]), err)
		}
		w.kickOutbox(cmd.Slots)
	case cmdReject:
		// A refused copy: the queue's own at-least-once dead-lettering
		// takes the message instead.
		s := cmd.Slots[0]
		err := s.d.Reject(false)
		w.settled(cmd.Slots, ActionDeadLetter, err)
		if err != nil {
			return fmt.Errorf("queue %s: reject event %s: %w", w.queue, eventID(s), err)
		}
	case cmdClose:
		// Everything unsettled goes back together, in order; a close that
		// fails has lost the channel, which returns it all the same.
		w.settled(cmd.Slots, ActionRequeue, w.ch.Close())
	}
	return nil
}

// open opens the worker's channel and consumes the queue on it with
// prefetch. Global QoS is not implemented for quorum queues (3.10 closes
// the connection with 540), hence global=false.
func (w *worker) open(prefetch int) error {
	ch, err := w.conn.Channel()
	if err != nil {
		return fmt.Errorf("queue %s: open channel: %w", w.queue, err)
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return fmt.Errorf("queue %s: qos: %w", w.queue, err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	deliveries, err := ch.Consume(w.queue, w.tag,
		false, // auto-ack: never; the ack comes after the commit
		false, // exclusive: single active consumer does this across replicas
		false, // no-local
		false, // no-wait
		w.svc.cfg.ConsumerArgs(w.index))
	if err != nil {
		return fmt.Errorf("consume %s: %w", w.queue, err)
	}
	w.ch, w.closed, w.deliveries = ch, closed, deliveries
	return nil
}

// copy publishes a copy of s with the failure headers to the dead-letter
// exchange and waits for the broker's confirm. While a resource alarm
// blocks publishing, the broker confirms nothing until it passes, which may
// be never if the backlog feeds it: then the letter is parked in the
// database instead (Parker), for the outbox drain to publish, and the
// message is acked, so that what is behind it goes on. A session that ends
// while the confirm is awaited returns the original. Either way at worst
// the DLQ holds a letter twice.
func (w *worker) copy(session context.Context, s *slot) (copyResult, error) {
	at := time.Now()
	msg := dlq.Copy(s.d, dlq.Failure{
		Class:    string(s.Class),
		Reason:   s.Err.Error(),
		Queue:    w.queue,
		Instance: w.svc.cfg.Instance,
		At:       at,
	})
	parker, canPark := w.svc.app.(Parker)
	var alarm <-chan struct{}
	if canPark && w.letters.letters != nil {
		alarm = w.letters.letters.alarmOn()
		select {
		case <-alarm:
			return w.park(parker, s, at)
		default:
		}
	}
	ctx, cancel := context.WithCancel(session)
	defer cancel()
	if alarm != nil {
		go func() { // ends with ctx at the latest
			select {
			case <-alarm:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	err := w.publish(ctx, dlq.Exchange(w.svc.cfg.Topology.Prefix), s.d.RoutingKey, msg)
	switch {
	case err == nil:
		return copied, nil
	case session.Err() == nil && alarm != nil && isClosed(alarm):
		w.letters.abandon()
		return w.park(parker, s, at)
	case session.Err() != nil:
		w.svc.log.Warn("the session ended before the dead-letter copy was confirmed; the message is returned",
			"queue", w.queue, "event_id", eventID(s))
		return copyCut, err
	}
	say := "dead-letter copy not confirmed, rejecting to the broker's dead-lettering"
	if _, refused := errors.AsType[*dlq.Refused](err); refused {
		say = "dead-letter copy refused by the broker (access refused), rejecting to the broker's dead-lettering"
	}
	w.svc.log.Error(say, "queue", w.queue, "event_id", eventID(s), "err", err)
	return copyRefused, err
}

// park writes s's dead letter to the database for the outbox drain to
// publish once the alarm passes; the message is then acked. A failure is
// the environment's: the core waits and tries again.
func (w *worker) park(parker Parker, s *slot, at time.Time) (copyResult, error) {
	ctx, cancel := context.WithTimeout(w.work, w.svc.cfg.ApplyTimeout)
	defer cancel()
	typ := s.Event.Type
	if typ == "" {
		typ = s.d.Type
	}
	err := parker.Park(ctx, OutboxLetter{
		EventID: eventID(s), EventType: typ, Class: string(s.Class), Reason: s.Err.Error(),
		RoutingKey: s.d.RoutingKey, MessageID: s.d.MessageId, ContentType: s.d.ContentType,
		Body: s.d.Body, Headers: HeadersJSON(s.d.Headers), Queue: w.queue, At: at,
	})
	if err != nil {
		return copyFailed, fmt.Errorf("park a dead letter during a broker alarm: %w", err)
	}
	w.svc.log.Warn("a broker alarm holds dead letters back: parked this one in the database, to be published when it passes",
		"queue", w.queue, "event_id", eventID(s), "class", string(s.Class))
	return copied, nil
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// kickOutbox has the outbox drained when a commit among slots left a dead
// letter behind (a transition that waited for this creation contradicts
// it). The drain runs on its own: no worker waits on its confirms.
func (w *worker) kickOutbox(slots []*slot) {
	for _, s := range slots {
		if s.Outbox {
			w.svc.kickDrain()
			return
		}
	}
}

// reportBlocked reports the queue blocked, retrying its first event in
// place after delay.
func (w *worker) reportBlocked(attempt int, delay time.Duration) {
	err := w.core.lastErr
	if err == nil {
		err = errors.New("unknown")
	}
	b := &w.blocked
	if b.Attempts == 0 {
		b.Since = time.Now()
		w.th = retry.Throttle{}
	}
	b.Queue, b.TraceID = w.queue, w.traceID
	if p := w.core.pending(); len(p) > 0 {
		b.EventID = p[0].Event.ID
	} else if len(w.core.slots) > 0 {
		b.EventID = eventID(w.core.slots[0])
	}
	b.Attempts, b.Class, b.Reason = attempt+1, ClassOf(context.Background(), err), err.Error()
	w.svc.setBlocked(*b)
	logBlocked(w.svc.log, &w.th, *b, delay)
	if w.svc.cfg.ObserveRetry != nil {
		w.svc.cfg.ObserveRetry(Retry{Queue: w.queue, EventID: b.EventID, Attempt: attempt + 1, Delay: delay, Err: err})
	}
}

// unblock clears the blocked report once the core has no failure to
// retry any more.
func (w *worker) unblock() {
	b := w.blocked
	if b.Attempts == 0 || w.core.failures > 0 {
		return
	}
	w.blocked = Blocked{}
	w.svc.clearBlocked(w.queue)
	w.svc.log.Info("queue unblocked", "queue", w.queue, "event_id", b.EventID, "attempts", b.Attempts,
		"blocked_ms", time.Since(b.Since).Milliseconds())
}

// settled records, logs and observes the decision about each of slots,
// settled by action (sendErr: the channel's error, if it failed).
func (w *worker) settled(slots []*slot, action Action, sendErr error) {
	for _, s := range slots {
		a := action
		if s.Fate == fateCopied || s.Fate == fateRefused {
			a = ActionDeadLetter
		}
		class := s.Class
		if a == ActionRequeue && class == "" {
			class = ClassShutdown // returned unapplied, not for its own fault
		}
		dec := Decision{
			Queue:         w.queue,
			EventID:       eventID(s),
			EventType:     s.Event.Type,
			TraceID:       traceID(s.span, s.d.Headers),
			Redelivered:   s.d.Redelivered,
			DeliveryCount: dlq.DeliveryCount(s.d.Headers),
			Class:         class,
			Action:        a,
			Duplicate:     s.Duplicate,
			Retries:       s.Retries,
			Duration:      time.Since(s.start),
		}
		if a != ActionAck || s.Fate == fateCopied {
			dec.Err = s.Err
		}
		if a == ActionAck {
			dec.Class = ""
		}
		if dec.EventType == "" {
			dec.EventType = s.d.Type
		}
		if a != ActionAck && dec.Err == nil {
			dec.Err = errReturned
		}
		w.svc.logDecision(dec, sendErr)
		if w.svc.cfg.Observe != nil {
			w.svc.cfg.Observe(dec)
		}
		if s.span != nil {
			endDelivery(s.span, dec)
		}
	}
}

// errReturned is the outcome of a delivery that went back to its queue
// unapplied because the session ended or one before it went back.
var errReturned = errors.New("returned to the queue unapplied, in order")

// eventID names s's event: the body's eventId when it could be read, which
// is authoritative even when it is poison, else the message_id property.
func eventID(s *slot) string {
	if s.Event.ID != "" {
		return s.Event.ID
	}
	return s.d.MessageId
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
