package consumer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
	"transferconsumer/event"
)

// Outbox is implemented by an Applier whose transactions may leave dead
// letters behind, to be published after the commit: a row a transaction
// writes is not lost by a crash before the publish, and it is published at
// least once.
type Outbox interface {
	// DrainOutbox hands each waiting letter to publish and forgets it once
	// publish returned nil. It returns how many it published.
	DrainOutbox(ctx context.Context, publish func(event.OutboxLetter) error) (int, error)
}

// Parker is implemented by an Applier that can keep a dead letter until
// its outbox drain publishes it. While a broker alarm holds a dead letter's
// copy back, the worker parks the letter instead and acks the message, so
// that the valid events behind it on its queue go on (adr/0002). A letter
// with Abandoned is held back from the drain until its answer comes: only a
// crash or a lost database connection meanwhile lets it out early (the
// DLQ may then hold it twice, never zero times).
type Parker interface {
	Park(ctx context.Context, l event.OutboxLetter) error
}

// tableFromJSON is the way back: JSON numbers that are whole become int64.
func tableFromJSON(b []byte) amqp.Table {
	if len(b) == 0 {
		return nil
	}
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if dec.Decode(&m) != nil {
		return nil
	}
	return fromJSON(m).(amqp.Table)
}

func fromJSON(v any) any {
	switch v := v.(type) {
	case map[string]any:
		t := amqp.Table{}
		for k, x := range v {
			t[k] = fromJSON(x)
		}
		return t
	case []any:
		for i, x := range v {
			v[i] = fromJSON(x)
		}
		return v
	case json.Number:
		if n, err := v.Int64(); err == nil {
			return n
		}
		f, _ := v.Float64()
		return f
	}
	return v
}

// drainOutbox publishes the dead letters the applier's transactions left
// behind, each as a dead letter of its own with the failure headers, and
// records and logs each as a decision. queue is where they are said to have
// failed ("" when not known). It does nothing when the applier has no
// outbox; a failure leaves the rest for the next drain.
func (s *Service) drainOutbox(ctx context.Context, queue string, publish func(exchange, key string, msg amqp.Publishing) error) {
	ob, ok := s.app.(Outbox)
	if !ok {
		return
	}
	_, err := ob.DrainOutbox(ctx, func(l event.OutboxLetter) error {
		start := time.Now()
		d := amqp.Delivery{
			Exchange: s.cfg.Topology.Prefix, RoutingKey: l.RoutingKey, Body: l.Body, Headers: tableFromJSON(l.Headers),
			MessageId: l.MessageID, ContentType: l.ContentType, Type: l.EventType,
		}
		failure := dlq.Failure{Class: l.Class, Reason: l.Reason, Queue: l.Queue, Instance: s.cfg.Instance, At: l.At}
		if failure.Queue == "" {
			failure.Queue = queue
		}
		if failure.At.IsZero() {
			failure.At = start
		}
		msg := dlq.Copy(d, failure)
		if err := publish(dlq.Exchange(s.cfg.Topology.Prefix), l.RoutingKey, msg); err != nil {
			return err
		}
		if l.Parked {
			s.log.Info("parked dead letter published", "queue", failure.Queue, "event_id", l.EventID, "class", l.Class)
			return nil
		}
		dec := Decision{Queue: failure.Queue, EventID: l.EventID, EventType: l.EventType, Class: event.Class(l.Class),
			Action: ActionDeadLetter, Err: fmt.Errorf("%s", l.Reason), Duration: time.Since(start)}
		s.logDecision(dec, nil)
		if s.cfg.Observe != nil {
			s.cfg.Observe(dec)
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		s.log.Warn("dead letters left by transactions not all published; the next drain retries", "err", err)
	}
}

// kickDrain has the drain loop drain the outbox now.
func (s *Service) kickDrain() {
	select {
	case s.drainNow <- struct{}{}:
	default:
	}
}

// drainLoop drains the outbox every lookEvery, and when a worker's commit
// left a dead letter there, until session ends, on a dead-letter channel of
// its own: no worker waits on its confirms, which an alarm may hold back,
// and it picks up what a crash left.
func (s *Service) drainLoop(session context.Context, letters *letters) {
	out := letterChannel{letters: letters}
	publish := func(exchange, key string, msg amqp.Publishing) error {
		return out.publish(session, exchange, key, msg, true) // waits out an alarm
	}
	tick := time.NewTicker(lookEvery)
	defer tick.Stop()
	for {
		select {
		case <-session.Done():
			return
		case <-tick.C:
			s.drainOutbox(session, "", publish)
		case <-s.drainNow:
			s.drainOutbox(session, "", publish)
		}
	}
}
