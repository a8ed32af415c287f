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

func (s streamStore) readAll(ctx context.Context, since time.Time, wants map[string]*want) error {
	begin(wants, since)
	open, n := len(wants), 0
	err := s.s.Scan(ctx, since, func(queue string, m event.Spilled, at time.Time) (bool, error) {
		if n++; n == 1 {
			headAt(wants, at)
		}
		p := publishing(queue, m, at)
		ended, err := takeDelivery(wants, p.Headers, p.Body)
		open -= ended
		return open <= 0, err
	})
	if err != nil {
		return err
	}
	fenced(wants)
	return nil
}

// begin starts a read of wants from since.
func begin(wants map[string]*want, since time.Time) {
	for _, w := range wants {
		w.found = Found{Tail: w.after, FromStart: since.IsZero()}
	}
}

// headAt notes when the read's first message was written.
func headAt(wants map[string]*want, at time.Time) {
	for _, w := range wants {
		w.found.Head = at
	}
}

// fenced ends a read that came to its fence: each queue's last entries
// go to its page.
func fenced(wants map[string]*want) {
	for _, w := range wants {
		if w.err == nil && len(w.found.Entries) > 0 {
			w.err = w.page(w.found)
		}
		w.found.Entries = nil
	}
}
