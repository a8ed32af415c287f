package journal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"transferconsumer/event"
)

// A restore's dead letters: the letter of an entry the database refuses
// when applied again (letter), and how every letter a restore writes goes
// with the move of the mark past its entry, in one transaction
// (parkMarked). An entry that no longer decodes comes with its letter
// from the read (wire.go).

// refused logs an entry that the database refused when applied again.
func (l *Lane) refused(e Entry, err error) {
	l.log.Error("journal: an entry the service had applied and acked was refused when applied again; it goes to the dead-letter queue",
		"queue", l.queue, "seq", e.Seq, "event_id", e.Event.ID, "err", err)
}

// letter is e's dead letter, for refused: the outbox, which the service
// drains to the dead-letter queue, takes it.
func (l *Lane) letter(ctx context.Context, e Entry, refused error) event.OutboxLetter {
	m := e.Event.Message
	return event.OutboxLetter{
		EventID: e.Event.ID, EventType: e.Event.Type, Class: string(event.ClassOf(ctx, refused)),
		Reason:     fmt.Sprintf("applied and acked once, then refused when applied again from the journal (entry %d of %s): %v", e.Seq, l.queue, refused),
		RoutingKey: m.RoutingKey, MessageID: m.MessageID, ContentType: m.ContentType, Body: m.Body,
		Headers: event.HeadersJSON(m.Headers), Queue: l.queue, At: time.Now(),
	}
}

// parkMarked parks lt in the outbox and moves the mark from prev to last
// in the same transaction (MarkedParker), the mark's time staying, as
// applyMarked moves it, and returns the mark the database then holds.
// When another reader's restore of the queue has moved the mark to last
// or past it, that reader parked the letter: it returns no error, and the
// mark it found.
func (l *Lane) parkMarked(ctx context.Context, lt event.OutboxLetter, prev, last int64) (int64, error) {
	mp, ok := l.inner.(MarkedParker)
	if !ok {
		return prev, errors.New("the database's lane cannot park a letter with the journal's mark")
	}
	err := mp.ParkMarked(ctx, lt, event.Mark{Queue: l.queue, Prev: prev, Last: last, Restore: true})
	if errors.Is(err, event.ErrJournalGap) {
		if held, _, merr := l.inner.Marked(ctx, l.queue); merr == nil && held >= last {
			return held, nil
		}
	}
	if err != nil {
		return prev, err
	}
	return last, nil
}
