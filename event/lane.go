package event

import (
	"context"
	"errors"
	"time"
)

// The interfaces of this file are ports that the database implements for
// the consumer and the journal. They are kept here, beside the event they
// apply, because the database, which imports neither the consumer nor the
// journal, must name their types to implement them: Lane, which the
// consumer's Lanes port returns; MarkedLane, the lane the journal wraps
// (Journal.Wrap); and JournalSpill, where the journal keeps what its
// stream does not take. The consumer's other ports stay in the consumer.

// Lane applies one worker's events, one at a time.
type Lane interface {
	Apply(ctx context.Context, ev Event) (Result, error)
	Close() // releases what the lane holds; it is not used again
}

// Mark is where an attempt stands in its queue's journal (the journal
// package, adr/0014): the database holds Prev as the queue's last journal
// sequence, and the attempt's events take Prev+1 … Last. The transaction
// that applies them moves the database's mark from Prev to Last, or fails
// with ErrJournalGap when the database does not hold Prev.
//
// The move also sets the mark's time, where a read of the journal starts:
// to the commit's, since the entries above Last are written after it;
// with Restore (a restore applying entries the journal holds, a loss
// accepted) it stays where it was, since the entries above Last were
// written before: a restore cut short goes on, from the moved mark, with
// a read that still reaches them.
type Mark struct {
	Queue      string
	Prev, Last int64
	Restore    bool
}

// MarkedLane is a lane whose transactions also record the journal's mark,
// so that the database can tell which journal entries it holds.
type MarkedLane interface {
	Lane
	// ApplyMarked applies evs in one transaction, as a BatchLane's
	// ApplyBatch does, and moves the mark in that same transaction. With
	// no events it moves the mark alone.
	ApplyMarked(ctx context.Context, evs []Event, m Mark) ([]Outcome, error)
	// Marked returns queue's mark as the database holds it, and when it
	// was set (0 and the zero time for a queue never marked).
	Marked(ctx context.Context, queue string) (seq int64, at time.Time, err error)
}

// ErrJournalGap: the database does not hold the mark an attempt went on
// from. It lost commits (a failover to a standby that was behind, a
// restore to an earlier time), or another consumer of the queue moved the
// mark; the journal holds what is missing.
var ErrJournalGap = errors.New("the database does not hold the journal mark the service went on from")

// ErrJournalUnread: a lane cannot go on before it reads the journal (the
// database may have lost commits whose entries only the journal holds),
// and the read cannot begin now (a broker alarm holds its fence, the
// stream does not answer). The queue's event in hand waits meanwhile.
var ErrJournalUnread = errors.New("the journal cannot be read now")

// Spilled is one journal message kept in the database while the journal's
// stream does not take it: one queue's entries First … Last (Entries of
// them), as the message's body.
type Spilled struct {
	First, Last int64
	Entries     int
	Body        []byte
}

// JournalSpill keeps a queue's journal messages in the database while the
// stream does not take them (a broker alarm, a stream that is unavailable
// while the broker is up), so that their events can be acked meanwhile
// and the messages written to the stream, in order, once it takes them
// again (the journal package, adr/0014).
type JournalSpill interface {
	// Spill keeps msgs, one queue's, in order; keeping one already kept
	// is harmless. It keeps them only while the database holds their
	// commits (its mark of the queue is at or past their last entry), and
	// fails otherwise: a restore reads the stream for what is above the
	// mark, so it must never need a kept entry.
	Spill(ctx context.Context, queue string, msgs []Spilled) error
	// Spilled returns up to limit of the queue's kept messages, in the
	// order of their sequences.
	Spilled(ctx context.Context, queue string, limit int) ([]Spilled, error)
	// Kept returns the sequences of the queue's kept messages, as runs of
	// consecutive sequences in ascending order: what the journal's writer
	// then counts as kept (and unprotected), and looks for again when
	// their messages are gone from the database.
	Kept(ctx context.Context, queue string) ([]KeptRun, error)
	// Unspill deletes the queue's kept messages up to sequence last, once
	// the stream confirmed them.
	Unspill(ctx context.Context, queue string, last int64) error
	// Mark returns the queue's journal mark as the database holds it (0
	// for a queue never marked). Kept messages that are gone while the
	// mark is below their entries went with their commits (a failover, a
	// restore): their entries are in neither the stream nor the database.
	Mark(ctx context.Context, queue string) (int64, error)
}

// KeptRun is a run of a queue's kept journal entries, First … Last, each
// sequence of it kept once, and when its first message was kept (the
// database's clock): its events were acked since.
type KeptRun struct {
	First, Last int64
	At          time.Time
}
