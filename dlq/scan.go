package dlq

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// queueReader is what scan needs of a channel.
type queueReader interface {
	QueueDeclarePassive(name string, durable, autoDelete, exclusive, noWait bool, args amqp.Table) (amqp.Queue, error)
	Get(queue string, autoAck bool) (amqp.Delivery, bool, error)
	Nack(tag uint64, multiple, requeue bool) error
}

// scan gets at most as many messages as the queue held when it started,
// one by one, holding each unacknowledged so that the next get returns the
// next message, and calls visit until it says there is no more to do or the
// queue has no more. It returns how many messages it got and that depth.
//
// The depth bounds the run: a dead letter that arrives while it runs, such
// as one that a replay put back and that failed again, goes to the queue's
// tail, behind the messages counted at the start, so a scan reaching the
// tail would meet its own work again and could go on as long as something
// keeps failing.
//
// The depth is the first message plus the ready ones a passive declare
// counts right after it was got. A quorum queue answers the declare from the
// state its leader has applied, which lacks the messages another reader
// returned a moment before (say, a list just before a replay) until their
// return is committed; a get goes through the queue's log, behind those
// returns, so once it is answered the count includes them.
//
// visit may ack a message and says so; every message it did not ack is
// returned to the queue at the end, with one nack of the highest delivery
// tag still held (a multiple nack naming a tag already acked would be
// refused and close the channel). On an error the caller closes the
// channel, which returns anything still held.
func scan(ch queueReader, queue string,
	visit func(amqp.Delivery, Letter) (more, acked bool, err error)) (scanned, depth int, err error) {
	return scanTold(ch, queue, nil, visit)
}

// scanTold is scan, telling told (when set) the depth it bounds itself by
// before it visits the first message.
func scanTold(ch queueReader, queue string, told func(depth int),
	visit func(amqp.Delivery, Letter) (more, acked bool, err error)) (scanned, depth int, err error) {
	var held uint64 // the highest delivery tag not acked
	var visitErr error
	for scanned == 0 || scanned < depth {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			return scanned, depth, fmt.Errorf("get from %s: %w", queue, err)
		}
		if !ok {
			break // empty, or someone else took messages meanwhile
		}
		if scanned == 0 {
			q, err := ch.QueueDeclarePassive(queue,
				true,  // durable
				false, // auto-delete
				false, // exclusive
				false, // no-wait
				nil)
			if err != nil {
				return 0, 0, fmt.Errorf("read the depth of %s: %w", queue, err) // closing the channel returns d
			}
			depth = 1 + q.Messages
			if told != nil {
				told(depth)
			}
		}
		scanned++
		more, acked, err := visit(d, Describe(d))
		if !acked {
			held = d.DeliveryTag
		}
		if err != nil {
			visitErr = err
			break
		}
		if !more {
			break
		}
	}
	if held > 0 {
		if err := ch.Nack(held, true, true); err != nil { // multiple, requeue
			return scanned, depth, errors.Join(visitErr, fmt.Errorf("return unreplayed letters to %s: %w", queue, err))
		}
	}
	return scanned, depth, visitErr
}
