package topology

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Grow is the first half of raising the queue count from t.Queues to `to`
// (adr/0004). It declares queues t.Queues … to-1 and binds them to the hash
// exchange, which moves some routing keys to the new queues at once; then it
// waits until every old queue has been seen empty, so that each message
// published before the new bindings (the only ones whose key may have moved)
// has been taken by the old queue's consumer. Nothing consumes the new queues
// yet, so an account's older events are applied before its newer ones. The
// second half is to run the replicas with QUEUE_COUNT=to. progress, when set,
// is told what is happening. It returns ctx's error if the wait is cut short;
// the bindings stay, and running Grow again resumes the wait.
func (t Spec) Grow(ctx context.Context, conn *amqp.Connection, to int, progress func(string)) error {
	if to <= t.Queues {
		return fmt.Errorf("grow from %d queues to %d: the new count must be larger", t.Queues, to)
	}
	say := func(format string, a ...any) {
		if progress != nil {
			progress(fmt.Sprintf(format, a...))
		}
	}
	grown := t
	grown.Queues = to
	if err := grown.Declare(conn); err != nil {
		return err
	}
	say("declared and bound %s … %s; keys that moved now collect there", t.Queue(t.Queues), t.Queue(to-1))

	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	waiting := map[string]bool{}
	for i := 0; i < t.Queues; i++ {
		waiting[t.Queue(i)] = true
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for len(waiting) > 0 {
		for q := range waiting {
			st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
			if err != nil {
				return fmt.Errorf("inspect %s: %w", q, err)
			}
			if st.Messages == 0 {
				delete(waiting, q)
				say("%s has been empty: its messages from before the change are taken", q)
			}
		}
		if len(waiting) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d old queue(s) to drain: %w", len(waiting), ctx.Err())
		case <-tick.C:
		}
	}
	say("done: now run every replica with QUEUE_COUNT=%d", to)
	return nil
}

// Existing counts the partition queues PREFIX.0, PREFIX.1, … that exist,
// looking no further than t.Queues: 0 on a vhost without the topology,
// t.Queues when it has at least as many as t names. It asks with passive
// declares, one channel each, and stops at the first queue missing (the
// broker logs that one as a channel error, once).
func (t Spec) Existing(conn *amqp.Connection) (int, error) {
	for i := 0; i < t.Queues; i++ {
		ch, err := conn.Channel()
		if err != nil {
			return i, fmt.Errorf("open channel: %w", err)
		}
		_, err = ch.QueueDeclarePassive(t.Queue(i), true, false, false, false, nil)
		ch.Close()
		var ae *amqp.Error
		switch {
		case errors.As(err, &ae) && ae.Code == amqp.NotFound:
			return i, nil
		case err != nil:
			return i, fmt.Errorf("look for %s: %w", t.Queue(i), err)
		}
	}
	return t.Queues, nil
}
