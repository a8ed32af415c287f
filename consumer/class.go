package consumer

import (
	"context"
	"errors"
)

// Class is a failure class. Every error that reaches the handler is put in
// exactly one class, here and nowhere else, and the class alone decides what
// happens to the message (see adr/0001 and the table in decide).
type Class string

const (
	// ClassPoison: the message can never be applied (bad JSON, invalid
	// fields, unknown type). Dead-lettered at once, never retried.
	ClassPoison Class = "poison"
	// ClassConflict: the eventId was already applied with other content.
	// That is producer corruption: dead-lettered and raised, never applied.
	ClassConflict Class = "producer-conflict"
	// ClassTransition: a lifecycle event that contradicts the transfer's
	// state (completed after failed, or the reverse; a second creation; data
	// that does not match the transfer). Dead-lettered, never applied.
	ClassTransition Class = "invalid-transition"
	// ClassTransient: the service's own dependency failed (database down,
	// connection lost, serialization failure, deadlock). Retried in place,
	// without returning the message, so its delivery count is not burnt.
	ClassTransient Class = "transient"
	// ClassUnknown: anything not classified. Requeued; the quorum queue's
	// delivery limit turns a message that always fails into a dead letter.
	ClassUnknown Class = "unknown"
	// ClassShutdown: the service is stopping. Not a failure: requeued,
	// never dead-lettered.
	ClassShutdown Class = "shutdown"
)

// ErrShutdown is the cancellation cause of the context handed to Run's
// workers when the service stops, so that shutdown is never mistaken for a
// failure of the message.
var ErrShutdown = errors.New("service shutting down")

type classified struct {
	class Class
	err   error
}

func (c *classified) Error() string { return c.err.Error() }
func (c *classified) Unwrap() error { return c.err }

// Poison marks err as permanent: the message is dead-lettered now.
func Poison(err error) error { return wrap(ClassPoison, err) }

// Conflict marks err as a producer conflict: same eventId, other content.
func Conflict(err error) error { return wrap(ClassConflict, err) }

// Transition marks err as a lifecycle event that contradicts its transfer.
func Transition(err error) error { return wrap(ClassTransition, err) }

// Transient marks err as a fault of a dependency that will pass: the
// message is retried in place.
func Transient(err error) error { return wrap(ClassTransient, err) }

func wrap(class Class, err error) error {
	if err == nil {
		return nil
	}
	return &classified{class: class, err: err}
}

// ClassOf returns the class of err: poison, conflict and transition as
// marked, since no shutdown makes them less permanent; ClassShutdown when ctx
// was cancelled because the service is stopping; else the class err was
// marked with, or ClassUnknown. It returns "" for a nil error.
func ClassOf(ctx context.Context, err error) Class {
	if err == nil {
		return ""
	}
	var c *classified
	marked := errors.As(err, &c)
	if marked && (c.class == ClassPoison || c.class == ClassConflict || c.class == ClassTransition) {
		return c.class
	}
	if errors.Is(context.Cause(ctx), ErrShutdown) {
		return ClassShutdown
	}
	if marked {
		return c.class
	}
	return ClassUnknown
}

// Action is what the handler does with a delivery once it has decided.
type Action string

const (
	ActionAck        Action = "ack"         // after the commit, or for a duplicate
	ActionDeadLetter Action = "dead-letter" // copy to the DLQ with reasons, then ack
	ActionRequeue    Action = "requeue"     // Reject(requeue=true)
)

// decide maps a class to the one thing that happens to the message. A
// transient error only gets here when retrying in place was cut short by
// shutdown, so it requeues like shutdown does.
func decide(class Class) Action {
	switch class {
	case "":
		return ActionAck
	case ClassPoison, ClassConflict, ClassTransition:
		return ActionDeadLetter
	default: // ClassTransient, ClassUnknown, ClassShutdown
		return ActionRequeue
	}
}
