package event

import (
	"context"
	"errors"
)

// Class is a failure class. Every error that reaches the handler is put in
// exactly one class, here and nowhere else. The consumer's core
// (consumer/core.go) decides from the class, through its table (decide, in
// consumer/core_class.go), and from what it knows of the queue (a batch to
// split, a panic's count and blame, the session's end): adr/0002. The
// question is always whether the message caused the failure: only then may
// it go to the dead-letter queue.
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
	// ClassRejected: the database rejected the event's own values, the same
	// way on every attempt (a data exception such as a balance that would
	// overflow, a constraint its data breaks). Dead-lettered at once.
	ClassRejected Class = "data-rejected"
	// ClassUnauthorized: the message's first producer is not in PRODUCERS,
	// or no user_id says who it is (adr/0008). Dead-lettered, never applied.
	ClassUnauthorized Class = "unauthorized"
	// ClassTransient: the environment failed (database down, closed for
	// maintenance, read-only, a revoked grant, a missing function, a lock or
	// statement timeout, serialization failure, deadlock). Retried in place,
	// without returning the message, for as long as it lasts.
	ClassTransient Class = "transient"
	// ClassUnknown: an error nobody classified. Treated like the
	// environment's fault, since the safe side is never the DLQ: retried in
	// place, with an alarm, until someone fixes it.
	ClassUnknown Class = "unknown"
	// ClassPanic: handling this message panicked. Retried in place; after
	// three panics of it alone dead-lettered, unless the queue's last dead
	// letter was a panic too with nothing applied since (consumer/core.go).
	ClassPanic Class = "panic"
	// ClassShutdown: the service is stopping. Not a failure: requeued,
	// never dead-lettered.
	ClassShutdown Class = "shutdown"
)

// ErrShutdown is the cancellation cause of the context handed to the
// consumer's workers (Service.Run) when the service stops, so that shutdown
// is never mistaken for a failure of the message.
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

// Rejected marks err as the database refusing the event's own values, as it
// will on every attempt: the message is dead-lettered now.
func Rejected(err error) error { return wrap(ClassRejected, err) }

// Unauthorized marks err as a message from a producer PRODUCERS does not
// list: the message is dead-lettered now.
func Unauthorized(err error) error { return wrap(ClassUnauthorized, err) }

// Transient marks err as a fault of the environment: the message is
// retried in place until it passes.
func Transient(err error) error { return wrap(ClassTransient, err) }

// Panicked marks err as a panic met while handling the message: retried in
// place; the consumer's core decides when it is the message's.
func Panicked(err error) error { return wrap(ClassPanic, err) }

func wrap(class Class, err error) error {
	if err == nil {
		return nil
	}
	return &classified{class: class, err: err}
}

// CausedByMessage reports whether class says the message itself is at
// fault, which no shutdown makes less true.
func CausedByMessage(class Class) bool {
	switch class {
	case ClassPoison, ClassConflict, ClassTransition, ClassRejected, ClassUnauthorized:
		return true
	}
	return false
}

// ClassOf returns the class of err: the message's own faults as marked;
// ClassShutdown when ctx was cancelled because the service is stopping; else
// the class err was marked with, or ClassUnknown. It returns "" for a nil
// error.
func ClassOf(ctx context.Context, err error) Class {
	if err == nil {
		return ""
	}
	var c *classified
	marked := errors.As(err, &c)
	if marked && CausedByMessage(c.class) {
		return c.class
	}
	if errors.Is(context.Cause(ctx), ErrShutdown) || errors.Is(err, ErrShutdown) {
		return ClassShutdown
	}
	if marked {
		return c.class
	}
	return ClassUnknown
}
