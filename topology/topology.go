// Package topology administers the broker side the service consumes from:
// the hash exchange, the partition queues and the dead-letter pair. It
// declares them (Declare), grows their number without reordering an
// account's events (Grow), says what permissions that takes (LeastGrants),
// and, when others declared them, checks their arguments through the
// management API (Verify, Checker) and looks for queues beyond the count
// (Look). The delivery path (package consumer) uses it; it uses nothing
// of the delivery path.
package topology

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
)

// Spec names and shapes what the service consumes: the consistent-hash
// exchange Prefix, the quorum queues Prefix.0 … Prefix.(Queues-1) bound to it
// with weight 1, and the dead-letter pair from package dlq.
type Spec struct {
	Prefix        string
	Queues        int
	DeliveryLimit int
}

// Queue returns the name of queue i.
func (t Spec) Queue(i int) string { return fmt.Sprintf("%s.%d", t.Prefix, i) }

// QueueArgs returns the arguments every partition queue is declared with.
// Single active consumer keeps one consumer per queue across replicas, so an
// account's events are applied in queue order; the delivery limit both turns
// an always-failing message into a dead letter and, on 3.x, makes a requeued
// message go back near the head instead of the tail (see adr/0001).
func (t Spec) QueueArgs() amqp.Table {
	return amqp.Table{
		"x-queue-type":             "quorum",
		"x-single-active-consumer": true,
		"x-delivery-limit":         int64(t.DeliveryLimit),
		"x-dead-letter-exchange":   dlq.Exchange(t.Prefix),
		// at-least-once dead-lettering needs reject-publish; without both
		// the broker silently falls back to at-most-once.
		"x-dead-letter-strategy": "at-least-once",
		"x-overflow":             "reject-publish",
		// In a cluster, each new queue's leader goes to the node that
		// leads the fewest, not to the node the declaring connection is
		// on: the queues' work and a node's loss spread over the cluster.
		leaderLocator: "balanced",
	}
}

// leaderLocator is the one argument a queue declared before it existed may
// lack: Declare accepts such a queue as it is.
const leaderLocator = "x-queue-leader-locator"

// Error is a topology the service cannot use as it stands: a missing
// plugin or a queue declared elsewhere with other arguments. Retrying cannot
// fix it, so the consumer stops with it.
type Error struct {
	Object string // "exchange transfers", "queue transfers.3"
	Err    error  // what the broker said
	Fix    string // what a person should do
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %v; to fix: %s", e.Object, e.Err, e.Fix)
}

func (e *Error) Unwrap() error { return e.Err }

// Declare declares the whole topology, idempotently. It returns a
// *Error when the broker refuses it for a reason retrying cannot
// fix, and the plain error otherwise.
func (t Spec) Declare(conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer func() { ch.Close() }() // the channel in use at the end: declareQueue may replace it

	version, _ := conn.Properties["version"].(string)
	if err := dlq.Declare(ch, t.Prefix, version); err != nil {
		return t.translateDeclareError("dead-letter topology", err)
	}
	if err := ch.ExchangeDeclare(t.Prefix, "x-consistent-hash",
		true,  // durable
		false, // auto-delete
		false, // internal
		false, // no-wait
		nil); err != nil {
		return t.translateDeclareError("exchange "+t.Prefix, err)
	}
	for i := 0; i < t.Queues; i++ {
		q := t.Queue(i)
		if ch, err = declareQueue(conn, ch, q, t.QueueArgs()); err != nil {
			return t.translateDeclareError("queue "+q, err)
		}
		// The binding key of a consistent-hash exchange is the weight.
		if err := ch.QueueBind(q, "1", t.Prefix, false, nil); err != nil {
			return t.translateDeclareError("binding of queue "+q, err)
		}
	}
	return nil
}

// declareQueue declares a partition queue durable with args. A queue
// declared before the leader locator was one of its arguments is refused
// for that argument alone (406, which closes the channel): it is then
// declared again, on a new channel, without it. It returns the channel to
// go on with.
func declareQueue(conn *amqp.Connection, ch *amqp.Channel, name string, args amqp.Table) (*amqp.Channel, error) {
	declare := func(ch *amqp.Channel, args amqp.Table) error {
		_, err := ch.QueueDeclare(name,
			true,  // durable
			false, // auto-delete
			false, // exclusive
			false, // no-wait
			args)
		return err
	}
	err := declare(ch, args)
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed || !strings.Contains(ae.Reason, "'"+leaderLocator+"'") {
		return ch, err
	}
	fresh, err := conn.Channel()
	if err != nil {
		return ch, fmt.Errorf("open channel: %w", err)
	}
	ch = fresh
	older := amqp.Table{}
	for k, v := range args {
		if k != leaderLocator {
			older[k] = v
		}
	}
	return ch, declare(ch, older)
}

var inequivalent = regexp.MustCompile(`inequivalent arg '([^']+)' for (queue|exchange) '([^']+)'`)

func (t Spec) translateDeclareError(object string, err error) error {
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		return fmt.Errorf("declare %s: %w", object, err)
	}
	switch {
	case ae.Code == amqp.CommandInvalid && strings.Contains(ae.Reason, "x-consistent-hash"):
		return &Error{Object: object, Err: err,
			Fix: "the broker lacks the consistent-hash exchange type: enable the plugin with `rabbitmq-plugins enable rabbitmq_consistent_hash_exchange`"}
	case ae.Code == amqp.PreconditionFailed:
		if m := inequivalent.FindStringSubmatch(ae.Reason); m != nil {
			return &Error{Object: m[2] + " " + m[3], Err: err,
				Fix: fmt.Sprintf("the %s exists with a different %s than this service declares; "+
					"set the service's variables to match it, or drain and delete the %s so it can be declared again, "+
					"or set DECLARE_TOPOLOGY=false to use it as it is", m[2], m[1], m[2])}
		}
		return &Error{Object: object, Err: err, Fix: "make the existing object match or delete it"}
	case ae.Code == amqp.AccessRefused:
		return &Error{Object: object, Err: err, Fix: "this user may not declare it: either have an administrator " +
			"declare the topology (`transferconsumer topology`, as a user with " + LeastGrants(t.Prefix, true).String() +
			") and run the service with DECLARE_TOPOLOGY=false, which needs only " + LeastGrants(t.Prefix, false).String() +
			", or grant this user " + LeastGrants(t.Prefix, true).String() + " on the vhost"}
	}
	return fmt.Errorf("declare %s: %w", object, err)
}
