package consumer

import "transferconsumer/event"

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
