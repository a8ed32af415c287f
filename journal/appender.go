package journal

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"transferconsumer/event"
	"transferconsumer/retry"
)

// appender writes a lane's entries to the stream after their transaction
// committed, in the order the transactions committed, while the lane's
// worker goes on with the next transaction: the worker acks a
// transaction's events only once Journaled says its entries are held
// (adr/0014). What is queued when a write begins goes in that write
// together.
//
// Held means confirmed by the stream, or, while the stream does not take
// them, kept in the database (the spill): a broker alarm blocks every
// publish, a stream can be unavailable while the broker is up, and the
// acks must not wait on either, or the backlog stops and the held
// deliveries run into the broker's consumer timeout. A write the stream
// has not confirmed within keepAfter (at once while the broker blocks the
// journal's publishes) keeps its entries in the database, and the acks go;
// from then on the queue's entries go to the database too, behind those
// kept, until the stream takes the kept ones, oldest first, and each is
// deleted once confirmed. So a later transaction's entries never reach the
// stream before an earlier one's. While kept, entries are counted
// (Reports.Unprotected): a failover or a restore that takes their commits
// back takes them too, and then they are counted lost (kept.go).
//
// Without a spill, or while the database does not take them either, a
// write is tried again in place, the same entries with the same
// sequences, until one of the two holds them or the lane closes, and
// nothing is acked meanwhile. A lane closed with entries unconfirmed
// leaves their sequences unused in the stream; their events, never acked,
// come back to the queue, and are journaled then as duplicates, under new
// sequences.
type appender struct {
	j         store
	spill     event.JournalSpill // nil: none
	keepAfter time.Duration
	queue     string
	log       *slog.Logger
	reports   Reports

	mu      sync.Mutex
	waiting []outgoing    // queued, oldest first, not yet in a write
	last    chan struct{} // closed once everything queued so far is held
	top     int64         // the highest sequence queued so far
	// kept counts the entries in the database that the stream has not
	// taken yet; -1 until the writer looked (a crash may have left some).
	// runs are their sequences (kept.go); doubt, those gone from the
	// database with their commits, lost unless the journal holds them,
	// which the lane's next read of it tells.
	kept    int
	runs    keptRuns
	doubt   keptRuns
	running bool          // the writer has entries queued or kept
	idle    chan struct{} // closed when running turns false
	wake    chan struct{}
	stop    context.CancelFunc
	exited  chan struct{}
	// going: the lane's worker commits from goingFrom now (committing).
	going     bool
	goingFrom int64
	// paging is closed once the page of kept messages on its way to the
	// stream is written and deleted; nil while none is (drainPage).
	paging chan struct{}
	// The writer's own: when the stream is next tried for the kept
	// entries, and how many tries failed in a row.
	drainAt   time.Time
	drainFail int
}

// outgoing is one transaction's entries, what is closed once they are
// held, and when they were queued.
type outgoing struct {
	entries   []Entry
	journaled chan struct{}
	queued    time.Time
}

// writeRetry paces the writes tried again, and the stream's tries for the
// entries kept in the database.
var writeRetry = retry.Backoff{Min: 50 * time.Millisecond, Max: 5 * time.Second}

// add queues entries, and returns what is closed once they are held.
func (a *appender) add(entries []Entry) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	o := outgoing{entries: entries, journaled: make(chan struct{}), queued: time.Now()}
	a.waiting = append(a.waiting, o)
	a.last = o.journaled
	for _, e := range entries {
		a.top = max(a.top, e.Seq)
	}
	a.start()
	return o.journaled
}

// start has the writer run, starting its goroutine the first time. Under
// mu.
func (a *appender) start() {
	if !a.running {
		a.running = true
		a.idle = make(chan struct{})
		if a.wake == nil {
			if a.spill != nil {
				a.kept = -1 // the writer looks first
			}
			a.wake, a.exited = make(chan struct{}, 1), make(chan struct{})
			ctx, stop := context.WithCancel(context.Background())
			a.stop = stop
			go a.run(ctx)
		}
	}
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// journaled returns what is closed once every entry queued so far is
// held: nil when all are.
func (a *appender) journaled() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.unheld()
}

// unheld is journaled's answer. Under mu.
func (a *appender) unheld() <-chan struct{} {
	if a.last == nil {
		return nil
	}
	select {
	case <-a.last:
		return nil
	default:
		return a.last
	}
}

// busy reports whether entries are on their way, or kept in the database.
func (a *appender) busy() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.unheld() != nil || a.kept != 0
}

// close stops the writes: what is unconfirmed stays so.
func (a *appender) close() {
	a.mu.Lock()
	stop, exited := a.stop, a.exited
	a.mu.Unlock()
	if stop != nil {
		stop()
		<-exited
	}
}

func (a *appender) run(ctx context.Context) {
	defer close(a.exited)
	for {
		batch, ok := a.next(ctx)
		if !ok {
			return
		}
		var entries []Entry
		for _, o := range batch {
			entries = append(entries, o.entries...)
		}
		if !a.put(ctx, entries) {
			return
		}
		for _, o := range batch {
			close(o.journaled)
			if a.reports.Held != nil {
				a.reports.Held(a.queue, time.Since(o.queued))
			}
		}
	}
}

// next takes what is queued; with nothing queued but entries kept, it
// waits until the stream is due to be tried for them, and returns none.
// It returns false once the lane closed.
func (a *appender) next(ctx context.Context) ([]outgoing, bool) {
	for {
		a.mu.Lock()
		batch, kept := a.waiting, a.kept
		a.waiting = nil
		if len(batch) > 0 {
			a.mu.Unlock()
			return batch, true
		}
		wait := time.Duration(-1) // none: nothing is kept
		if kept == 0 {
			if a.running {
				a.running = false
				close(a.idle)
			}
		} else if wait = time.Until(a.drainAt); wait <= 0 {
			a.mu.Unlock()
			return nil, true
		}
		a.mu.Unlock()
		if !a.sleep(ctx, wait) {
			return nil, false
		}
	}
}

// sleep waits until woken (new entries, or a flush), for wait at most
// (none when negative); false when the lane closed first.
func (a *appender) sleep(ctx context.Context, wait time.Duration) bool {
	var due <-chan time.Time
	if wait >= 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		due = t.C
	}
	select {
	case <-a.wake:
	case <-due:
	case <-ctx.Done():
		return false
	}
	return true
}

// put brings entries (none: only those kept) to the stream, or keeps them
// in the database while the stream does not take them, and returns once
// one of the two holds them; false when the lane closed first.
func (a *appender) put(ctx context.Context, entries []Entry) bool {
	if len(entries) == 0 {
		// Only the kept entries: a try that fails holds nothing, and the
		// next is due after its backoff (failed); new entries meanwhile
		// go to the database at once.
		if err := a.try(ctx, nil); err != nil && ctx.Err() == nil {
			a.log.Debug("journal: the stream does not take the kept entries yet", "queue", a.queue, "err", err)
		}
		return ctx.Err() == nil
	}
	msgs, encErr := encode(entries) // of Go values json.Marshal always takes: a bug, held in place visibly
	var since time.Time
	n, err := retry.Until(ctx, writeRetry, func() error {
		if encErr != nil {
			return encErr
		}
		return a.try(ctx, msgs)
	}, func(attempt int, err error, _ time.Duration, logDue bool) {
		if attempt == 1 {
			since = time.Now()
		}
		if a.reports.Stalled != nil {
			a.reports.Stalled(a.queue, since, attempt, entries[0].Event.ID, err)
		}
		if logDue {
			a.log.Warn("journal: neither the stream nor the database took a transaction's entries; its events are not acked, and the write is tried again",
				"queue", a.queue, "from_seq", entries[0].Seq, "entries", len(entries), "attempt", attempt, "err", err)
		}
	})
	switch {
	case err != nil: // the lane closes: no one waits on its entries now
		if !since.IsZero() {
			a.healed()
		}
		return false
	case n > 1:
		a.log.Info("journal: the entries it could not write are held now", "queue", a.queue, "attempts", n)
		a.healed()
	}
	return true
}

func (a *appender) healed() {
	if a.reports.Healed != nil {
		a.reports.Healed(a.queue)
	}
}

// try makes one attempt at holding msgs: the entries kept in the database
// go to the stream first, when the stream is due to be tried, then msgs;
// while the stream does not take them, msgs are kept in the database
// behind the others.
func (a *appender) try(ctx context.Context, msgs []event.Spilled) error {
	if a.spill == nil {
		return a.j.write(ctx, a.queue, msgs)
	}
	a.mu.Lock()
	kept, due := a.kept, !time.Now().Before(a.drainAt)
	a.mu.Unlock()
	var err error
	if kept != 0 && due {
		err = a.drain(ctx)
		a.mu.Lock()
		kept = a.kept
		a.mu.Unlock()
	}
	if kept == 0 && len(msgs) > 0 {
		write, cancel := context.WithTimeout(ctx, a.keepAfter)
		err = a.j.write(write, a.queue, msgs)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		a.failed()
	}
	if len(msgs) == 0 || kept < 0 {
		// Nothing to keep; or the database did not say what it keeps:
		// nothing goes in front of what may be there.
		return err
	}
	if kerr := a.spill.Spill(ctx, a.queue, msgs); kerr != nil {
		return errors.Join(err, kerr)
	}
	a.mu.Lock()
	if a.kept == 0 {
		a.log.Warn("journal: the stream does not take the entries; they are kept in the database until it does, and their events acked",
			"queue", a.queue, "from_seq", msgs[0].First, "err", err)
	}
	n := a.keep(msgs)
	a.mu.Unlock()
	a.unprotected(n)
	return nil
}

// failed notes a try of the stream that failed: the next is due after a
// backoff, and meanwhile entries go to the database without waiting.
func (a *appender) failed() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.drainAt = time.Now().Add(writeRetry.Delay(a.drainFail))
	a.drainFail++
}
