package consumer

import (
	"context"
	"errors"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/event"
)

// The worker's I/O goes through these small ports, so that model_test.go
// can run the real worker (worker.go) against its models of the broker and
// the database, one step at a time. The database lane is event.Lane
// (BatchLane, in applier.go) and the parker Parker (outbox.go).

// channelPort is the worker's AMQP channel: *amqp.Channel. Its deliveries
// and its close notification reach the worker through its loopPort.
type channelPort interface {
	Ack(tag uint64, multiple bool) error
	Reject(tag uint64, requeue bool) error
	Close() error
	IsClosed() bool
}

// letterPort publishes dead-letter copies: *letterChannel.
type letterPort interface {
	// alarmed reports whether a broker alarm blocks publishing now (and
	// the letter can be parked instead).
	alarmed() bool
	// publish publishes msg and returns nil only once the broker
	// confirmed it, waiting as long as ctx lasts. Unless force, an alarm
	// that starts while the confirm is awaited ends the wait with an
	// *alarmCut.
	publish(ctx context.Context, exchange, key string, msg amqp.Publishing, force bool) error
}

// errAlarmCut: a broker alarm began while a dead letter's confirm was
// awaited; the publish may still be confirmed once it passes.
var errAlarmCut = errors.New("a broker alarm blocks publishing: the confirm was not awaited")

// alarmCut is errAlarmCut with the publish's answer to come: nil for a
// confirm, else why it was not confirmed.
type alarmCut struct{ answer <-chan error }

func (*alarmCut) Error() string        { return errAlarmCut.Error() }
func (*alarmCut) Is(target error) bool { return target == errAlarmCut }

// loopEvent is what the worker's loop waits for (loopPort.next).
type loopEvent struct {
	Kind   loopEventKind
	D      amqp.Delivery // hDelivery
	Reason *amqp.Error   // hNoDeliveries, hChannelClosed: the broker's reason for closing the channel, when known
}

type loopEventKind int

const (
	hDelivery      loopEventKind = iota // a delivery arrived
	hNoDeliveries                       // no more deliveries: the channel closed, or the broker cancelled the consumer
	hTimer                              // the timer armed last is due
	hEnded                              // the session ended
	hChannelClosed                      // the channel's close notification
	hJournaled                          // the journal ticket the core awaits is held (its channel is closed)
)

// loopPort is where the worker's loop waits: *amqpLoop, which selects on
// the channel's deliveries and close notification, the session's end and
// a timer. model_test.go's picks among what its broker model has ready,
// in any order the real select could.
type loopPort interface {
	// arm arms the timer to be due after d, in place of one armed before.
	arm(d time.Duration)
	// next waits for the next loopEvent; the session's end (or, once it
	// was told, the shutdown timeout's) is one when ended is closed, and
	// the journal holding the ticket the core awaits one when journaled
	// is (nil: not watched).
	next(ended, journaled <-chan struct{}) loopEvent
	// arrived returns a delivery that has arrived already, without
	// waiting: the worker gathers a batch with it.
	arrived() (amqp.Delivery, bool)
	// stop stops the timer.
	stop()
}

// decoder decodes a delivery's body: event.Decode, unless a test makes
// it panic.
type decoder func(body []byte, messageID, typ string) (event.Event, error)

// clock is the worker's time: time.Now, unless a test says otherwise.
type clock func() time.Time

// stepState is where the worker stands once it has carried out every
// command the core had: idle (waiting for an event), waiting (a timer is
// due), or done.
type stepState int

const (
	stepIdle stepState = iota
	stepWait
	stepDone
)
