package event

import "context"

// Lane applies one worker's events, one at a time. It is the one port of
// the consumer's kept here, beside the event it applies: the consumer's
// Lanes port returns it, and the database's lanes, which do not import the
// consumer, must name that type to implement the port.
type Lane interface {
	Apply(ctx context.Context, ev Event) (Result, error)
	Close() // releases what the lane holds; it is not used again
}
