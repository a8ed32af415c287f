package consumer

import (
	"context"
	"errors"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The worker's I/O goes through these small ports, so that model_test.go
// can run the real worker (worker.go) against its models of the broker and
// the database, one step at a time. The database lane is event.Lane
// (BatchLane, in applier.go) and the parker Parker (outbox.go).

// channelPort is the worker's AMQP channel: *amqp.Channel. Its deliveries
// and its close notification reach the worker as events (worker.take,
// worker.cancelled, worker.channelClosed).
type channelPort interface {
	Ack(tag uint64, multiple bool) error
	Reject(tag uint64, requeue bool) error
	Cancel(consumer string, noWait bool) error
	Close() error
	IsClosed() bool
}

// letterPort publishes dead-letter copies: *letterChannel.
type letterPort interface {
	// alarmed reports whether a broker alarm blocks publishing now (and
	// the letter can be parked instead).
	alarmed() bool
	// publish publishes msg and returns nil only once the broker
	// confirmed it, waiting as long as ctx lasts. An alarm that starts
	// while the confirm is awaited ends the wait with an *alarmCut.
	publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error
}

// errAlarmCut: a broker alarm began while a dead letter's confirm was
// awaited; the publish may still be confirmed once it passes.
var errAlarmCut = errors.New("a broker alarm blocks publishing: the confirm was not awaited")

// alarmCut is errAlarmCut with the publish's answer to come: nil for a
// confirm, else why it was not confirmed.
type alarmCut struct{ answer <-chan error }

func (*alarmCut) Error() string        { return errAlarmCut.Error() }
func (*alarmCut) Is(target error) bool { return target == errAlarmCut }

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
