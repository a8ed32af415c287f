package journal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"transferconsumer/event"
)

// Lane is a worker's database lane with the journal: it gives the events
// it applies their queue's next sequences, moves the database's mark with
// them in their transaction, and journals those the worker will ack
// (applied, or duplicates) before Apply returns, so before the ack. Before
// its first attempt, and again whenever the database does not hold the
// mark it went on from (event.ErrJournalGap), it applies the queue's
// entries the database lacks, in the journal's order (Recover). It
// implements the consumer's BatchLane.
type Lane struct {
	j     *Journal
	queue string
	inner event.MarkedLane
	log   *slog.Logger
	// Restored, when set, counts entries applied again from the journal.
	Restored func(queue string, n int)

	prev   int64 // the queue's last sequence, as the database holds it once synced
	synced bool
}

// Wrap returns inner with the journal, for queue's worker.
func (j *Journal) Wrap(queue string, inner event.MarkedLane, log *slog.Logger) *Lane {
	return &Lane{j: j, queue: queue, inner: inner, log: log}
}

// Apply applies ev, as the inner lane would, and journals it.
func (l *Lane) Apply(ctx context.Context, ev event.Event) (event.Result, error) {
	outs, err := l.ApplyBatch(ctx, []event.Event{ev})
	if err != nil {
		return event.Result{}, err
	}
	return outs[0].Result, outs[0].Err
}

// ApplyBatch applies evs in one transaction, as the inner lane would,
// and journals those that will be acked. An error means the worker must
// not ack: nothing was committed, or the journal could not take the
// entries (the retry finds them duplicates and journals them then).
func (l *Lane) ApplyBatch(ctx context.Context, evs []event.Event) ([]event.Outcome, error) {
	for again := true; ; again = false {
		if !l.synced {
			if _, err := l.Recover(ctx); err != nil {
				return nil, event.Transient(err)
			}
		}
		m := event.Mark{Queue: l.queue, Prev: l.prev, Last: l.prev + int64(len(evs))}
		outs, err := l.inner.ApplyMarked(ctx, evs, m)
		if errors.Is(err, event.ErrJournalGap) {
			l.synced = false
			l.log.Warn("journal: the database does not hold the mark the worker went on from; reading the journal again",
				"queue", l.queue, "err", err)
			if again {
				continue
			}
		}
		if err != nil {
			return nil, err
		}
		l.prev = m.Last
		entries := make([]Entry, 0, len(evs))
		for i, o := range outs {
			if o.Err == nil { // acked; an event with an error is dead-lettered
				entries = append(entries, Entry{Queue: l.queue, Seq: m.Prev + 1 + int64(i), Event: evs[i]})
			}
		}
		if err := l.j.Append(ctx, entries); err != nil {
			return nil, event.Transient(err)
		}
		return outs, nil
	}
}

// Recover applies the queue's journal entries the database lacks, in the
// journal's order, and returns how many it applied again. The inbox drops
// any the database still holds. It leaves the database's mark at the
// highest sequence the journal holds for the queue, or the database's own
// if that is higher.
func (l *Lane) Recover(ctx context.Context) (int, error) {
	mark, at, err := l.inner.Marked(ctx, l.queue)
	if err != nil {
		return 0, err
	}
	entries, _, tail, err := l.j.Read(ctx, l.queue, mark, at)
	if err != nil {
		return 0, err
	}
	prev, applied := mark, 0
	for _, e := range entries {
		last := max(prev, e.Seq)
		outs, err := l.inner.ApplyMarked(ctx, []event.Event{e.Event}, event.Mark{Queue: l.queue, Prev: prev, Last: last})
		var out error
		switch {
		case err == nil && len(outs) == 1:
			out = outs[0].Err
		case err != nil && event.CausedByMessage(event.ClassOf(ctx, err)):
			// It was applied once, so it should apply again; if the
			// database refuses it now, move past it and say so.
			out = err
			if _, err := l.inner.ApplyMarked(ctx, nil, event.Mark{Queue: l.queue, Prev: prev, Last: last}); err != nil {
				return applied, err
			}
		default:
			return applied, fmt.Errorf("journal: apply entry %d of %s again: %w", e.Seq, l.queue, err)
		}
		if out != nil {
			l.log.Error("journal: an entry the service had applied and acked was refused when applied again; it stays in the journal",
				"queue", l.queue, "seq", e.Seq, "event_id", e.Event.ID, "err", out)
		}
		prev, applied = last, applied+1
	}
	if tail > prev {
		if _, err := l.inner.ApplyMarked(ctx, nil, event.Mark{Queue: l.queue, Prev: prev, Last: tail}); err != nil {
			return applied, err
		}
		prev = tail
	}
	l.prev, l.synced = prev, true
	if applied > 0 {
		l.log.Warn("journal: applied again the entries the database had lost", "queue", l.queue, "entries", applied,
			"from_seq", mark+1, "to_seq", prev)
		if l.Restored != nil {
			l.Restored(l.queue, applied)
		}
	}
	return applied, nil
}

// Close closes the inner lane.
func (l *Lane) Close() { l.inner.Close() }
