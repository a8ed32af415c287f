package journal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"transferconsumer/event"
)

// The restore: what a Lane applies again from the journal (Recover), and
// its report when the journal does not reach back (ShortError).

// ShortError: the journal no longer reaches back to the start of a
// queue's gap. The entries between the database's mark and the journal's
// first entry of the queue are gone with the stream's retention, unless
// they were never written.
//
// Or, when Unreadable is set: one of the journal's messages of the queue,
// at Offset, holding entries Holds[0] … Holds[1], no longer parses (a body
// written by a version that differs, a damaged segment), so its entries
// above the mark cannot be applied again. An entry that no longer decodes
// in a message that parses is not reported so: it ends as a dead letter,
// and its neighbours are applied (Entry.Undecodable).
//
// Either way, the entries Mark+1 … First-1 are what accepting the loss
// (Lane.AcceptLoss, recover --accept-loss) moves the mark past.
type ShortError struct {
	Queue       string
	Mark, First int64     // the database's mark; the journal's first entry of the queue after the loss
	Since       time.Time // when the database's mark moved last
	Head        time.Time // the journal's first entry's time
	Unreadable  error     // why the message at Offset does not parse; nil for a retention gap
	Offset      any       // that message's offset in the stream
	Holds       [2]int64  // the first and last entry that message holds (some may be at or below Mark)
}

// Missing is how many events at most the journal cannot restore.
func (e *ShortError) Missing() int64 { return e.First - e.Mark - 1 }

func (e *ShortError) Error() string {
	if e.Unreadable != nil {
		return fmt.Sprintf("journal: queue %s cannot be restored whole: the database holds up to entry %d, "+
			"and the journal's message at offset %v, which holds entries %d to %d, does not parse (%v), so entries %d to %d "+
			"(%d events) cannot be applied again; the queue waits until an operator runs transferconsumer recover --accept-loss, "+
			"which moves the mark past them (adr/0014)",
			e.Queue, e.Mark, e.Offset, e.Holds[0], e.Holds[1], e.Unreadable, e.Mark+1, e.First-1, e.Missing())
	}
	return fmt.Sprintf("journal: queue %s cannot be restored whole: the database holds up to entry %d (moved %s), "+
		"the journal begins at %s and its first entry of the queue is %d, so up to %d events acked after %s are in neither; "+
		"the queue waits until an operator runs transferconsumer recover --accept-loss (adr/0014)",
		e.Queue, e.Mark, e.Since.UTC().Format(time.RFC3339), e.Head.UTC().Format(time.RFC3339), e.First, e.Missing(),
		e.Since.UTC().Format(time.RFC3339))
}

// ErrRestore is in the error of a lane's apply or park whose restore
// (Recover), which must end before the lane goes on, did not: its read was
// cut short, the database failed it, the lane's own entries on their way
// were not confirmed, or, as the errors it wraps then say too, the
// journal does not reach back (a *ShortError) or cannot be read
// (event.ErrJournalUnread). The service names a queue held so by what it
// wraps when that has a name, and as a restore under way otherwise
// (observe).
var ErrRestore = errors.New("journal: the restore of the queue did not end")

// restoreError is a restore's error as a lane's apply or park returns it:
// it reads as the error itself, and is an ErrRestore besides what it
// wraps.
type restoreError struct{ err error }

func (e *restoreError) Error() string        { return e.err.Error() }
func (e *restoreError) Unwrap() error        { return e.err }
func (e *restoreError) Is(target error) bool { return target == ErrRestore }

// Recover applies the queue's journal entries the database lacks, in the
// journal's order, and returns how many it applied again (the inbox drops
// any the database still holds). It leaves the database's mark at the
// highest sequence the journal holds for the queue, or at the database's
// own if that is higher.
//
// Which entries are missing is told by the sequences alone; where the read
// starts is chosen by time: Config.Skew before the mark's time (when it last
// moved, or when a read last synced it: Vouch).
// When the first entry of the queue it finds is past the one after the
// mark, it reads again from the stream's start, and if the journal begins
// after the mark moved, its retention may have taken events no one holds
// now: it returns a *ShortError, and the queue waits.
//
// Another reader restoring the same queue at once (a replica, the recover
// command) moves the mark under it: it then starts again from the mark
// the database holds, a few times.
func (l *Lane) Recover(ctx context.Context) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.recoverAgain(ctx)
}

func (l *Lane) recoverAgain(ctx context.Context) (int, error) {
	l.out.drainKept()
	if err := l.flushLost(ctx); err != nil {
		return 0, err
	}
	for try := 1; ; try++ {
		n, err := l.recover(ctx)
		if !errors.Is(err, event.ErrJournalGap) || try == 5 {
			return n, err
		}
	}
}

func (l *Lane) recover(ctx context.Context) (int, error) {
	r, err := l.startRestore(ctx)
	if r == nil {
		return 0, err
	}
	found, err := readOne(ctx, l.j, l.queue, r.mark, r.at, r.page)
	if errors.Is(err, errFromStart) {
		found, err = readOne(ctx, l.j, l.queue, r.mark, time.Time{}, r.page)
	}
	return r.end(found, err)
}

// startRestore starts a restore from the database's mark; with no restore to
// make, it returns why (the report of a journal that does not reach back,
// while the mark stays where it was).
func (l *Lane) startRestore(ctx context.Context) (*restoring, error) {
	began := time.Now()
	mark, at, err := l.inner.Marked(ctx, l.queue)
	if err != nil {
		return nil, err
	}
	if l.unrestorable != nil && l.unrestorable.Mark == mark && l.unrestorable.Since.Equal(at) {
		return nil, l.unrestorable
	}
	l.unrestorable = nil
	return &restoring{ctx: ctx, l: l, mark: mark, at: at, held: mark, began: began}, nil
}

// end ends a restore on what the read found (found) and how it ended
// (err): the mark moves to the highest sequence the read found of the
// queue, and the lane is synced.
func (r *restoring) end(found Found, err error) (int, error) {
	l := r.l
	if err == nil && !r.started {
		err = r.reachesBack(found)
	}
	var u *unreadable
	if errors.As(err, &u) {
		err = r.unreadable(u)
	}
	if err != nil {
		return r.applied, r.goOnVouched(err)
	}
	if found.Highest > r.held {
		if _, r.held, err = l.applyMarked(r.ctx, nil, r.held, found.Highest); err != nil {
			return r.applied, err
		}
	}
	l.prev, l.synced, l.checkedUnsynced = r.held, true, false
	if r.applied > 0 {
		l.log.Warn("journal: applied again the entries the database had lost", "queue", l.queue, "entries", r.applied,
			"from_seq", r.mark+1, "to_seq", r.held)
	}
	if v, ok := l.inner.(Voucher); ok {
		if err := v.Vouch(r.ctx, l.queue, r.held, r.began); err != nil {
			l.log.Warn("journal: could not record that the database holds the queue's journal; its next transaction reads the journal again, "+
				"and a start during an alarm will wait for the journal",
				"queue", l.queue, "err", err)
		}
	}
	return r.applied, nil
}

// unreadable reports u, a message of the queue that does not parse, met
// once the entries before it were applied: the queue waits, as for a
// journal that does not reach back, until the loss of its entries above
// the mark is accepted. The message may hold entries the database holds
// (a write of several transactions, some of whose commits the database
// kept): those are not lost, and the report names from the one after the
// mark.
func (r *restoring) unreadable(u *unreadable) error {
	l := r.l
	if u.last <= r.held {
		// Another reader's restore moved the mark past it meanwhile: the
		// database holds its entries; read again from there.
		return fmt.Errorf("journal: queue %s: %w: another reader's restore moved the mark to %d, past the message at offset %v "+
			"(entries %d to %d), which does not parse", l.queue, event.ErrJournalGap, r.held, u.offset, u.first, u.last)
	}
	_, at, err := l.inner.Marked(r.ctx, l.queue)
	if err != nil {
		return err
	}
	l.unrestorable = &ShortError{Queue: l.queue, Mark: r.held, First: u.last + 1, Since: at, Unreadable: u.err, Offset: u.offset,
		Holds: [2]int64{u.first, u.last}}
	l.log.Error("journal: a message of the queue does not parse; the queue waits until recover --accept-loss",
		"queue", l.queue, "from_seq", r.held+1, "to_seq", u.last, "offset", u.offset, "message_from_seq", u.first,
		"message_to_seq", u.last, "err", u.err)
	return l.unrestorable
}

// AcceptLoss moves the queue's mark past what a *ShortError says the
// journal cannot restore (its Mark+1 … First-1), so that Recover restores
// the rest, and logs what it moved past.
func (l *Lane) AcceptLoss(ctx context.Context, short *ShortError) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err := l.inner.ApplyMarked(ctx, nil, event.Mark{Queue: l.queue, Prev: short.Mark, Last: short.First - 1, Restore: true})
	if err != nil {
		return err
	}
	if short.Unreadable != nil {
		l.log.Error("journal: the loss of entries whose journal message does not parse is accepted; they will not be applied again",
			"queue", l.queue, "from_seq", short.Mark+1, "to_seq", short.First-1, "offset", short.Offset, "err", short.Unreadable)
	} else {
		l.log.Error("journal: the loss of entries the journal no longer holds is accepted; they will not be applied again",
			"queue", l.queue, "from_seq", short.Mark+1, "to_seq", short.First-1, "acked_after", short.Since)
	}
	return nil
}

// errFromStart: the read began after the queue's first entry above the
// mark; it is read again from the stream's start.
var errFromStart = errors.New("journal: the read began past the mark")

// restoreBatch is how many entries a restore applies in one transaction.
const restoreBatch = 100

// restoring is one restore of a queue from its mark: the pages of the
// journal's read are applied as they come, so a gap of any size takes the
// memory of a page.
type restoring struct {
	ctx      context.Context
	l        *Lane
	mark     int64     // the database's, when the restore began
	at       time.Time // when it moved
	began    time.Time // before its read's fence: what the vouch raises the mark's time to
	held     int64     // the mark the database holds now: mark, moved on by the restore (or another reader's)
	started  bool      // the first page was judged
	applied  int
	reported int // applied, as last logged
}

// reachesBack decides, on the read's first entries of the queue, whether they
// reach back to the mark: errFromStart when the read may have begun too
// late, a *ShortError when the journal itself begins too late.
func (r *restoring) reachesBack(f Found) error {
	if f.First <= r.mark+1 {
		return nil
	}
	if !f.FromStart {
		return errFromStart
	}
	if f.Head.After(r.at) {
		r.l.unrestorable = &ShortError{Queue: r.l.queue, Mark: r.mark, First: f.First, Since: r.at, Head: f.Head}
		return r.l.unrestorable
	}
	return nil
}

// page applies one page of the read's entries, in runs of up to
// restoreBatch events per transaction, after judging the first.
func (r *restoring) page(f Found) error {
	if !r.started {
		if err := r.reachesBack(f); err != nil {
			return err
		}
		r.started = true
	}
	for run := f.Entries; len(run) > 0; {
		if run[0].Seq <= r.held {
			// Another reader's restore moved the mark past it: that
			// reader applied it, or parked its letter.
			run = run[1:]
			continue
		}
		n := 1
		if !run[0].Dead {
			for n < len(run) && n < restoreBatch && !run[n].Dead {
				n++
			}
		}
		if err := r.apply(run[:n]); err != nil {
			return err
		}
		run = run[n:]
	}
	if r.applied >= r.reported+progressEvery {
		r.l.log.Info("journal: applying again the entries the database lost", "queue", r.l.queue,
			"entries", r.applied, "to_seq", r.held)
		r.reported = r.applied
	}
	return nil
}

// progressEvery is how many entries applied again a restore logs at.
const progressEvery = 10_000

// apply applies entries again in one transaction (one dead-lettered
// entry: moves the mark over it alone, parking its letter again if it has
// one). When the database refuses the transaction for one of its
// messages, it applies them one by one. Every letter it writes goes with
// the move of the mark past its entry, in one transaction (parkMarked):
// the letter is there once the mark is past it, so nothing acked
// vanishes, and a restore cut short before that commit wrote nothing, so
// its retry does not write the letter twice.
func (r *restoring) apply(entries []Entry) error {
	l, ctx := r.l, r.ctx
	if e := entries[0]; e.Letter != nil {
		// A letter parked in the lost commit: parked again (the DLQ may
		// hold it twice, should the outbox have sent it before the loss).
		// Or an entry that no longer decodes: applied and acked once, it
		// ends as a dead letter with its reason, and its neighbours are
		// applied.
		held, err := l.parkMarked(ctx, *e.Letter, r.held, max(r.held, e.Seq))
		if err != nil {
			return fmt.Errorf("journal: dead-letter entry %d of %s: %w", e.Seq, l.queue, err)
		}
		if e.Undecodable != nil {
			l.log.Error("journal: an entry the service had applied and acked no longer decodes when applied again; it goes to the dead-letter queue",
				"queue", l.queue, "seq", e.Seq, "event_id", e.Event.ID, "err", e.Undecodable)
		}
		r.held = held
		return nil
	}
	last := r.held
	var evs []event.Event
	for _, e := range entries {
		last = max(last, e.Seq)
		if !e.Dead {
			evs = append(evs, e.Event)
		}
	}
	outs, held, err := l.applyMarked(ctx, evs, r.held, last)
	if err != nil && len(entries) > 1 && event.CausedByMessage(event.ClassOf(ctx, err)) {
		for i := range entries {
			if err := r.apply(entries[i : i+1]); err != nil {
				return err
			}
		}
		return nil
	}
	var refused error
	switch {
	case err == nil: // outs is nil when another reader's restore applied them
	case event.CausedByMessage(event.ClassOf(ctx, err)):
		// It was applied once, so it should apply again; if the database
		// refuses it now, it ends as a dead letter with its reason, the
		// letter written with the move of the mark past it.
		refused = err
		if held, err = l.parkMarked(ctx, l.letter(ctx, entries[0], refused), r.held, last); err != nil {
			return fmt.Errorf("journal: dead-letter entry %d of %s, refused when applied again (%v): %w", entries[0].Seq, l.queue, refused, err)
		}
	default:
		return fmt.Errorf("journal: apply entries %d to %d of %s again: %w", entries[0].Seq, last, l.queue, err)
	}
	n := len(outs)
	for i, o := range outs {
		if o.Err != nil {
			l.refused(entries[i], o.Err) // entries with outcomes hold no dead one
		}
	}
	if refused != nil {
		l.refused(entries[0], refused)
		n = len(evs)
	}
	r.held = held
	r.applied += n
	if n > 0 && l.reports.Restored != nil {
		l.reports.Restored(l.queue, n)
	}
	return nil
}

// applyMarked applies evs (none: moves the mark alone) with the mark from prev to
// last, and returns the mark the database then holds. When another
// reader's restore of the queue (a replica, the recover command) has moved
// the mark to last or past it, that reader applied these entries: it
// returns no outcomes and no error, and the mark it found, so that the two
// restores go on together instead of each starting again. The mark's
// time stays (event.Mark's Restore): these entries, and those above them,
// were written before it.
func (l *Lane) applyMarked(ctx context.Context, evs []event.Event, prev, last int64) ([]event.Outcome, int64, error) {
	outs, err := l.inner.ApplyMarked(ctx, evs, event.Mark{Queue: l.queue, Prev: prev, Last: last, Restore: true})
	if errors.Is(err, event.ErrJournalGap) {
		if held, _, merr := l.inner.Marked(ctx, l.queue); merr == nil && held >= last {
			return nil, held, nil
		}
	}
	if err != nil {
		return nil, prev, err
	}
	if len(evs) == 0 {
		outs = nil
	}
	return outs, last, nil
}
