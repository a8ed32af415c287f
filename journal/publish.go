package journal

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A journal message goes to the stream through the default exchange. Were
// the stream gone (deleted by an operator), the exchange would drop the
// message and the broker still confirm it: entries lost, silently, and
// their events acked. So each is published mandatory, and one that comes
// back unroutable counts as not taken: the write is tried again on a new
// channel, which declares the stream again (or, with DECLARE_TOPOLOGY
// false, fails to find it, visibly).
//
// The broker sends a message's return before its confirm, and the client
// hands them over in that order on its one reading goroutine: a follower
// that reads both (follow) knows, when a confirm comes, whether its
// message came back first. A DeferredConfirmation alone could not tell.

// answers follows one channel's publishes to their answers.
type answers struct {
	mu       sync.Mutex
	waiting  map[uint64]chan error // by delivery tag: the publishes awaiting their answer
	early    map[uint64]error      // answers that came before their publish was awaited
	returned map[string]string     // message ids that came back, with the broker's reason, until their confirm
	closed   error                 // the channel closed: every answer to come is this
}

// follow reads ch's returns and confirms until it closes. It must be set
// up before ch publishes anything.
func follow(ch *amqp.Channel) *answers {
	a := &answers{waiting: map[uint64]chan error{}, early: map[uint64]error{}, returned: map[string]string{}}
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 128))
	go func() {
		for {
			select {
			case r, ok := <-returns:
				if !ok {
					returns = nil
					continue
				}
				a.mu.Lock()
				a.returned[r.MessageId] = fmt.Sprintf("%d %s", r.ReplyCode, r.ReplyText)
				a.mu.Unlock()
			case c, ok := <-confirms:
				if !ok {
					a.close(errors.New("the channel closed before the broker answered"))
					return
				}
				a.answer(c)
			}
		}
	}()
	return a
}

// answer records c, the broker's answer to one publish.
func (a *answers) answer(c amqp.Confirmation) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var err error
	if !c.Ack {
		err = errors.New("the broker refused it (nack)")
	}
	if why, ok := a.returned[idOf(c.DeliveryTag)]; ok {
		delete(a.returned, idOf(c.DeliveryTag))
		err = fmt.Errorf("the broker could not route it to the stream (%s): was the stream deleted?", why)
	}
	if w, ok := a.waiting[c.DeliveryTag]; ok {
		delete(a.waiting, c.DeliveryTag)
		w <- err
		return
	}
	a.early[c.DeliveryTag] = err
}

func (a *answers) close(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = err
	for tag, w := range a.waiting {
		w <- err
		delete(a.waiting, tag)
	}
}

// await returns where the answer to the publish of tag comes.
func (a *answers) await(tag uint64) <-chan error {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := make(chan error, 1)
	switch err, ok := a.early[tag]; {
	case ok:
		delete(a.early, tag)
		w <- err
	case a.closed != nil:
		w <- a.closed
	default:
		a.waiting[tag] = w
	}
	return w
}

// idOf is the message id of the publish of delivery tag on a channel:
// unique within the channel, which is where its return comes back.
func idOf(tag uint64) string { return "journal-" + strconv.FormatUint(tag, 10) }

// publish publishes msg to the stream, mandatory, on ch, whose answers a
// follows, and returns what waits for its answer: nil once the broker
// confirmed it routed to the stream.
func (j *Journal) publish(ctx context.Context, ch *amqp.Channel, a *answers, msg amqp.Publishing) (<-chan error, error) {
	j.pubMu.Lock()
	defer j.pubMu.Unlock()
	tag := ch.GetNextPublishSeqNo()
	msg.MessageId = idOf(tag)
	if err := ch.PublishWithContext(ctx, "", j.cfg.Stream, true, false, msg); err != nil {
		return nil, err
	}
	return a.await(tag), nil
}
