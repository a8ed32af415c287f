// Package dlq holds the dead-letter side of the topology: the exchange and
// queue dead letters go to, the headers that tell a person why a message is
// there, and the tools to inspect and replay them.
package dlq

import (
	"fmt"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Exchange returns the dead-letter exchange's name for a topology prefix.
func Exchange(prefix string) string { return prefix + ".dlx" }

// Queue returns the dead-letter queue's name for a topology prefix.
func Queue(prefix string) string { return prefix + ".dlq" }

// QueueArgs returns the dead-letter queue's arguments for a broker version.
// The DLQ keeps messages until someone acts, so it must have no delivery
// limit: looking at a message in the management UI ("Get messages" with
// requeue) counts as a return on a quorum queue. On 3.x a quorum queue has no
// limit unless one is set (and -1 is not "unlimited" there: it drops the
// message on its first return); from 4.0 the default is 20 and -1 disables it.
func QueueArgs(brokerVersion string) amqp.Table {
	args := amqp.Table{"x-queue-type": "quorum"}
	if major, _ := BrokerVersion(brokerVersion); major >= 4 {
		args["x-delivery-limit"] = int64(-1)
	}
	return args
}

// BrokerVersion returns the major and minor numbers of a RabbitMQ version
// such as "4.0.5", each 0 where it cannot be read. It lives here, beside
// QueueArgs, because topology and cli, which also decide by the version,
// import this package, and this package imports neither.
func BrokerVersion(version string) (major, minor int) {
	parts := strings.SplitN(version, ".", 3)
	if n, err := strconv.Atoi(parts[0]); err == nil {
		major = n
	}
	if len(parts) > 1 {
		if n, err := strconv.Atoi(parts[1]); err == nil {
			minor = n
		}
	}
	return major, minor
}

// Declare declares the dead-letter exchange (fanout: a dead letter keeps its
// original routing key, which must not decide whether it is kept) and the
// dead-letter queue bound to it.
func Declare(ch *amqp.Channel, prefix, brokerVersion string) error {
	if err := ch.ExchangeDeclare(Exchange(prefix), amqp.ExchangeFanout,
		true,  // durable
		false, // auto-delete
		false, // internal
		false, // no-wait
		nil); err != nil {
		return fmt.Errorf("exchange %s: %w", Exchange(prefix), err)
	}
	if _, err := ch.QueueDeclare(Queue(prefix),
		true,  // durable
		false, // auto-delete
		false, // exclusive
		false, // no-wait
		QueueArgs(brokerVersion)); err != nil {
		return fmt.Errorf("queue %s: %w", Queue(prefix), err)
	}
	if err := ch.QueueBind(Queue(prefix), "", Exchange(prefix), false, nil); err != nil {
		return fmt.Errorf("bind %s: %w", Queue(prefix), err)
	}
	return nil
}
