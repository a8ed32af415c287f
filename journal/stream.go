package journal

import (
	"context"
	"log/slog"
	"time"

	"transferconsumer/event"
)

// Stream is what a lane's entries go to and come back from, other than
// the Journal's RabbitMQ stream: a model of a stream, which a test of the
// worker that acks through the lane steps as it steps the broker
// (consumer's model test). It keeps the promises the Journal's stream
// keeps.
type Stream interface {
	// Write returns nil once the stream holds msgs, queue's entries, in
	// order after every message it held before; an error says nothing of
	// whether it holds them.
	Write(ctx context.Context, queue string, msgs []event.Spilled) error
	// Scan hands take the messages the stream holds, each with its queue
	// and when it was written, in the stream's order, from Config.Skew
	// before since (from its first when since is zero) up to the last it
	// held when Scan was called; it stops when take returns true or an
	// error.
	Scan(ctx context.Context, since time.Time, take func(queue string, m event.Spilled, at time.Time) (bool, error)) error
}

// NewLane returns a lane of queue over inner, as Journal.Wrap does, its
// entries going to s, with cfg's spill, letters and reports. No watch
// checks it.
func NewLane(s Stream, cfg Config, queue string, inner event.MarkedLane, log *slog.Logger) *Lane {
	return makeLane(streamStore{s}, cfg, queue, inner, log)
}

// streamStore is a Stream as a lane's store: its messages are read as
// the Journal's are, each as the publishing that carried it.
type streamStore struct{ s Stream }

func (s streamStore) write(ctx context.Context, queue string, msgs []event.Spilled) error {
	return s.s.Write(ctx, queue, msgs)
}

func (s streamStore) readAll(ctx context.Context, since time.Time, reads map[string]*queueRead) error {
	begin(reads, since)
	open, n := len(reads), 0
	err := s.s.Scan(ctx, since, func(queue string, m event.Spilled, at time.Time) (bool, error) {
		if n++; n == 1 {
			headAt(reads, at)
		}
		p := publishing(queue, m, at)
		ended, err := takeDelivery(reads, p.Headers, p.Body)
		open -= ended
		return open <= 0, err
	})
	if err != nil {
		return err
	}
	fenced(reads)
	return nil
}

// begin starts the read of each queue of reads from since.
func begin(reads map[string]*queueRead, since time.Time) {
	for _, qr := range reads {
		qr.found = Found{Highest: qr.after, FromStart: since.IsZero()}
	}
}

// headAt notes when the read's first message was written.
func headAt(reads map[string]*queueRead, at time.Time) {
	for _, qr := range reads {
		qr.found.Head = at
	}
}

// fenced ends a read that came to its fence: each queue's last entries
// go to its page.
func fenced(reads map[string]*queueRead) {
	for _, qr := range reads {
		if qr.err == nil && len(qr.found.Entries) > 0 {
			qr.err = qr.page(qr.found)
		}
		qr.found.Entries = nil
	}
}
