package consumer

import (
	"context"
	"errors"

	"transferconsumer/event"
)

// Action is what happens to a delivery.
type Action string

const (
	ActionAck        Action = "ack"         // after the commit, or for a duplicate
	ActionDeadLetter Action = "dead-letter" // copy to the DLQ with reasons, then ack
	ActionRetry      Action = "retry"       // keep the message, try again after a backoff
	ActionRequeue    Action = "requeue"     // back to the queue, in order, by the channel's close
)

// decide is the core's table (core.applied) from the class of an attempt's
// outcome to what happens to the message:
//
//	class                                   action
//	(none: applied or duplicate)            ack after the commit
//	poison, producer-conflict, unauthorized,
//	invalid-transition, data-rejected       dead-letter now (the message caused it); a batch is split first
//	transient, unknown                      retry in place (the environment caused it, or may have)
//	panic                                   retry in place; a batch is split; dead-letter after three panics alone,
//	                                        unless the queue's last dead letter was a panic with nothing applied since
//	shutdown                                requeue, never dead-letter
//
// A retry that the end of the broker session cuts short becomes a requeue,
// and so does everything behind a message that is requeued.
func decide(class event.Class) Action {
	switch {
	case class == "":
		return ActionAck
	case event.CausedByMessage(class):
		return ActionDeadLetter
	case class == event.ClassShutdown:
		return ActionRequeue
	default: // ClassTransient, ClassUnknown, ClassPanic
		return ActionRetry
	}
}

// classOf is the class of err, an attempt's failure, when the session had
// ended by then for ended (its context's cause; nil while it lasts): as
// event.ClassOf has it against the session's context. Shutdown is not a
// failure: an attempt it cut short is of class shutdown, whatever its
// error says, unless the message caused it; a session that ended for
// another cause (a failure elsewhere) changes nothing.
func classOf(err, ended error) event.Class {
	class := event.ClassOf(context.Background(), err)
	if class != "" && !event.CausedByMessage(class) && errors.Is(ended, event.ErrShutdown) {
		return event.ClassShutdown
	}
	return class
}
