package consumer

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"transferconsumer/dlq"
	"transferconsumer/event"
	"transferconsumer/retry"
)

// worker consumes one queue on its own channel: the thin shell around the
// queue's core (core.go). It turns deliveries, results and the session's
// end into the core's facts, and the core's commands into calls of its
// ports (ports.go). Channels are not safe for concurrent use, so nothing
// else touches ch.
type worker struct {
	svc            *Service
	index          int
	queue, tag     string
	conn           *amqp.Connection
	ch             channelPort
	loop           loopPort
	session        context.Context // ends with the broker session: nothing new is applied (Run, service.go)
	sessionEndTold bool            // the core was told that the session ended
	work           context.Context // outlives session, to ShutdownTimeout past shutdown (Run, service.go)
	workEndTold    bool            // the core was told that work ended
	lane           event.Lane      // when the applier has lanes; else each attempt gets a timeout context
	letters        letterPort      // where dead-letter copies go out
	parker         Parker          // where a dead letter waits out a broker alarm; nil when the applier cannot
	decoder        decoder         // event.Decode, unless a test says otherwise
	now            clock
	core           *core
	inFlight       map[uint64]*delivery // by tag: what the core holds no handle to
	failed         error                // why the channel failed or the consumer was cancelled
	// traced is the first delivery of the attempt under way's span
	// context, when tracing is on; traceID its trace, for log lines.
	traced  context.Context
	traceID string
	blocked Blocked        // while the core retries in place
	th      retry.Throttle // when to log a blocked queue
	// tickets: with the journal, what is closed once the journal holds
	// what was committed up to each ticket the core was given, by ticket
	// (worker_journal.go); ticket the last one given; await the one the
	// core's last command names.
	tickets       map[uint64]<-chan struct{}
	ticket, await uint64
}

// delivery is one delivery in hand, as the worker keeps it.
type delivery struct {
	d     amqp.Delivery
	span  trace.Span
	start time.Time
	// abandoned: the answer to its dead letter's publish that an alarm
	// cut short, for the parker.
	abandoned <-chan error
}

// run carries out the core's commands until it is finished: the session
// ended and what was in hand is settled or returned, or the channel closed.
// It returns an error when the channel failed or the broker cancelled the
// consumer, so that the session ends and consumes again. It waits for what
// happens next through its loopPort.
func (w *worker) run(session context.Context) error {
	w.session = session
	defer w.loop.stop()
	for {
		switch delay, state := w.advance(); state {
		case stepDone:
			return w.failed
		case stepWait:
			w.loop.arm(delay)
		}
		var ended <-chan struct{}
		switch {
		case !w.sessionEndTold:
			ended = session.Done()
		case !w.workEndTold:
			ended = w.work.Done() // the shutdown timeout: the core stops waiting for the journal
		}
		h := w.loop.next(ended, w.tickets[w.await])
		switch h.Kind {
		case hJournaled:
			w.journaled(w.await)
		case hDelivery:
			w.take(h.D)
			w.gather()
		case hNoDeliveries:
			// The channel closed, or the broker cancelled the consumer (a
			// consumer timeout on 4.3, a deleted queue).
			if h.Reason != nil || w.ch.IsClosed() {
				w.channelClosed(h.Reason)
			} else {
				w.cancelled()
			}
		case hTimer:
			w.core.tick()
		case hEnded:
			if !w.sessionEndTold {
				w.ended()
			} else {
				w.expired()
			}
		case hChannelClosed:
			w.channelClosed(h.Reason)
		}
	}
}

// advance carries out the core's commands until it has none for now, and
// says whether the core waits for a timer (of delay) or is done. Before
// each command it looks whether the session has ended: an ended session
// goes first, before deliveries waiting and before the next command; so
// does the shutdown timeout's end.
func (w *worker) advance() (time.Duration, stepState) {
	for {
		if !w.sessionEndTold && w.session.Err() != nil {
			w.ended()
		}
		if w.sessionEndTold && !w.workEndTold && w.work.Err() != nil {
			w.expired()
		}
		if delay, state, ran := w.step(); !ran {
			return delay, state
		}
	}
}

// step carries out the core's next command when there is one to carry out
// now (ran); else it says whether the core waits for a timer (of delay),
// is idle until something happens, or is done.
func (w *worker) step() (delay time.Duration, state stepState, ran bool) {
	cmd := w.core.next()
	w.await = cmd.Await
	switch cmd.Kind {
	case cmdDone:
		w.settled(cmd.Settled, nil) // gone back with the channel before they could be sent
		return 0, stepDone, false
	case cmdNone:
		return 0, stepIdle, false
	case cmdWait:
		delay = w.svc.cfg.BatchLinger
		if !cmd.Linger {
			delay = w.svc.cfg.Retry.Delay(cmd.Attempt)
			w.reportBlocked(cmd, delay)
		}
		return delay, stepWait, false
	}
	if err := w.exec(cmd); err != nil {
		w.fail(err)
		w.core.commandFailed(cmd, err) // the core decides what a failed command means
	}
	return 0, stepIdle, true
}

// ended: the session ended; the core is told once.
func (w *worker) ended() {
	w.sessionEndTold = true
	w.core.end()
}

// expired: the work's context ended (SHUTDOWN_TIMEOUT past shutdown); the
// core is told once.
func (w *worker) expired() {
	w.workEndTold = true
	w.core.expired()
}

func (w *worker) fail(err error) {
	if w.failed == nil {
		w.failed = err
	}
}

// channelClosed: the broker closed the channel (reason), or it was lost.
func (w *worker) channelClosed(reason *amqp.Error) {
	w.core.channelClosed()
	w.fail(fmt.Errorf("queue %s: consumer channel closed: %v", w.queue, reason))
}

// cancelled: the broker cancelled the consumer, the channel still open.
func (w *worker) cancelled() {
	w.core.cancel()
	w.fail(fmt.Errorf("queue %s: the broker cancelled the consumer", w.queue))
}

// gather takes in hand what else has already arrived, so that a batch
// holds it.
func (w *worker) gather() {
	if w.svc.cfg.BatchMax <= 1 {
		return
	}
	for {
		d, ok := w.loop.arrived()
		if !ok {
			return
		}
		w.take(d)
	}
}

// take hands d to the core with what the shell knows of it: its size, and
// whether its first producer is on the allow-list (judged, and stamped in
// the headers, before anything reads them: a dead letter's copy carries
// who sent it). The core decides whether it is decoded. A panic while
// decoding is recovered as ClassPanic.
func (w *worker) take(d amqp.Delivery) {
	var refused error
	d.Headers, refused = w.svc.cfg.Producers.Admit(d.UserId, d.Headers)
	h := &delivery{d: d, start: w.now()}
	if t := w.svc.cfg.Tracer; t != nil {
		_, h.span = w.startDelivery(t, d)
	}
	if w.inFlight == nil {
		w.inFlight = map[uint64]*delivery{}
	}
	w.inFlight[d.DeliveryTag] = h
	s := &inHand{Tag: d.DeliveryTag, Size: len(d.Body), Refused: refused}
	if w.core.deliver(s) {
		ev, err := w.decode(d)
		w.core.decoded(s, ev, err)
	}
}

// decode decodes d with the worker's decoder; a panic is a ClassPanic
// error.
func (w *worker) decode(d amqp.Delivery) (ev event.Event, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = w.panicked(d.MessageId, p)
		}
	}()
	decode := w.decoder
	if decode == nil {
		decode = event.Decode
	}
	ev, err = decode(d.Body, d.MessageId, d.Type)
	if err == nil {
		ev.Message = event.Message{RoutingKey: d.RoutingKey, Body: d.Body, Headers: d.Headers,
			MessageID: d.MessageId, ContentType: d.ContentType}
	}
	return ev, err
}

// exec carries out one command and feeds its result back to the core. It
// returns an error when the channel could not carry a settlement out; the
// broker then has the message back, which the inbox makes harmless.
func (w *worker) exec(cmd command) error {
	switch cmd.Kind {
	case cmdApply:
		outs, err := w.apply(cmd.Hand)
		w.awaitJournal() // a producer conflict's commit, too
		// The core classifies err, told why the session had ended by now.
		w.core.applied(outs, err, context.Cause(w.session))
		w.unblock()
	case cmdCopy:
		f, err := w.copy(cmd.Hand[0], cmd.Force, cmd.Answer)
		w.core.copied(f, err)
		w.unblock()
	case cmdPark:
		f, err := w.park(cmd.Hand[0])
		w.core.copied(f, err)
		w.unblock()
	case cmdAck, cmdReject:
		return w.settle(cmd)
	case cmdClose:
		// Everything unsettled goes back together, in order; a close that
		// fails has lost the channel, which returns it all the same.
		w.settled(cmd.Settled, w.ch.Close())
	}
	return nil
}

// settle sends the channel an ack or a reject of the core's.
func (w *worker) settle(cmd command) error {
	switch cmd.Kind {
	case cmdAck:
		id := w.eventID(cmd.Settled[0].Slot)
		err := w.ch.Ack(cmd.Tag, cmd.Multiple)
		w.settled(cmd.Settled, err)
		if err != nil {
			return fmt.Errorf("queue %s: ack event %s: %w", w.queue, id, err)
		}
		w.kickOutbox(cmd.Settled)
	case cmdReject:
		w.svc.log.Warn("rejecting to the queue's own dead-lettering: the dead-letter copy was not confirmed",
			"queue", w.queue, "event_id", w.eventID(cmd.Settled[0].Slot))
		// A refused copy: the queue's own at-least-once dead-lettering
		// takes the message instead.
		id := w.eventID(cmd.Settled[0].Slot)
		err := w.ch.Reject(cmd.Tag, false)
		w.settled(cmd.Settled, err)
		if err != nil {
			return fmt.Errorf("queue %s: reject event %s: %w", w.queue, id, err)
		}
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
	w.ch = ch
	w.loop = &amqpLoop{deliveries: deliveries, closed: closed}
	return nil
}

// kickOutbox has the outbox drained when a commit among the deliveries hand left a dead
// letter behind (a transition that waited for this creation contradicts
// it). The drain runs on its own: no worker waits on its confirms.
func (w *worker) kickOutbox(settled []settlement) {
	for _, st := range settled {
		if st.Slot.Outbox {
			w.svc.kickDrain()
			return
		}
	}
}

// settled logs and observes each decision the core made, settled by the
// channel (sendErr: its error, if it failed), and ends the deliveries'
// spans.
func (w *worker) settled(settled []settlement, sendErr error) {
	for _, st := range settled {
		s := st.Slot
		id := w.eventID(s)
		h := w.inFlight[s.Tag]
		delete(w.inFlight, s.Tag)
		if h == nil {
			h = &delivery{start: w.now()}
		}
		dec := Decision{
			Queue:         w.queue,
			EventID:       id,
			EventType:     s.Event.Type,
			TraceID:       traceID(h.span, h.d.Headers),
			Redelivered:   h.d.Redelivered,
			DeliveryCount: dlq.DeliveryCount(h.d.Headers),
			Class:         st.Class,
			Action:        st.Action,
			Duplicate:     s.Duplicate,
			Retries:       s.Retries,
			Err:           st.Err,
			Duration:      w.now().Sub(h.start),
		}
		if dec.EventType == "" {
			dec.EventType = h.d.Type
		}
		w.svc.logDecision(dec, sendErr)
		if w.svc.cfg.Observe != nil {
			w.svc.cfg.Observe(dec)
		}
		if h.span != nil {
			endDelivery(h.span, dec)
		}
	}
}

// eventID names s's event: the body's eventId when it could be read, which
// is authoritative even when it is poison, else the message_id property.
func (w *worker) eventID(s *inHand) string {
	if s.Event.ID != "" {
		return s.Event.ID
	}
	if h := w.inFlight[s.Tag]; h != nil {
		return h.d.MessageId
	}
	return ""
}
