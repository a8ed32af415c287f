package event

// Result is what applying an event did.
type Result struct {
	Duplicate bool // the event had been applied before; nothing changed
	// Outbox: the transaction left a dead letter to publish after the
	// commit (see the consumer's Outbox).
	Outbox bool
}

// Outcome is what applying one event of a batch did.
type Outcome struct {
	Result
	Err error
}
