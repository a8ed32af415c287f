package consumer

import (
	"runtime"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// amqpLoop is the worker's loopPort on an amqp091 channel.
type amqpLoop struct {
	deliveries <-chan amqp.Delivery
	closed     <-chan *amqp.Error // the channel's close notification
	timer      *time.Timer
	timerC     <-chan time.Time
}

func (l *amqpLoop) arm(d time.Duration) {
	l.stop()
	l.timer = time.NewTimer(d)
	l.timerC = l.timer.C
}

func (l *amqpLoop) stop() {
	if l.timer != nil {
		l.timer.Stop()
	}
}

func (l *amqpLoop) next(ended, journaled <-chan struct{}) loopEvent {
	select {
	case <-journaled:
		return loopEvent{Kind: hJournaled}
	case d, ok := <-l.deliveries:
		if ok {
			return loopEvent{Kind: hDelivery, D: d}
		}
		l.deliveries = nil
		h := loopEvent{Kind: hNoDeliveries}
		select { // the reason, when the channel closed with one
		case h.Reason = <-l.closed:
			l.closed = nil
		default:
		}
		return h
	case <-l.timerC:
		l.timerC = nil
		return loopEvent{Kind: hTimer}
	case <-ended:
		return loopEvent{Kind: hEnded}
	case e := <-l.closed:
		l.closed = nil
		return loopEvent{Kind: hChannelClosed, Reason: e}
	}
}

// arrived returns a delivery that has arrived. One may still be on its way
// through the client's buffering goroutine: it is let run once before the
// answer is no.
func (l *amqpLoop) arrived() (amqp.Delivery, bool) {
	for yielded := false; ; yielded = true {
		select {
		case d, ok := <-l.deliveries:
			return d, ok // a closed channel is seen again by next
		default:
		}
		if yielded {
			return amqp.Delivery{}, false
		}
		runtime.Gosched()
	}
}
