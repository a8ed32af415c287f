package journal

import (
	"context"
	"time"
)

// The drain: the writer takes the entries kept in the database to the
// stream, oldest first, a page at a time, and deletes each page once the
// stream confirmed it. An attempt of the writer (appender.try) drains
// first whenever the stream is due to be tried.

// drainPage is how many kept messages the stream is given at a time.
const drainPage = 100

// drain writes the entries kept in the database to the stream, oldest
// first, deleting each page once confirmed. Entries it counts kept that
// the database no longer keeps are settled first (vanished).
func (a *appender) drain(ctx context.Context) error {
	a.mu.Lock()
	unknown := a.kept < 0
	a.mu.Unlock()
	if unknown {
		found, err := a.spill.Kept(ctx, a.queue)
		if err != nil {
			return err
		}
		var runs keptRuns
		for _, r := range found {
			at := r.At
			if at.IsZero() {
				at = time.Now()
			}
			runs = runs.with(keptRun{r.First, r.Last, at})
		}
		n := runs.count()
		a.mu.Lock()
		a.runs, a.kept = runs, n
		a.mu.Unlock()
		if n > 0 {
			a.log.Warn("journal: entries a former process kept in the database are not in the stream yet; they go first",
				"queue", a.queue, "entries", n, "seqs", runs.String())
			a.unprotected(n)
		}
	}
	drained := 0
	for {
		done, err := a.drainPage(ctx, &drained)
		if done || err != nil {
			return err
		}
	}
}

// drainPage takes the oldest page of kept messages to the stream, and
// deletes it once confirmed; done when none was left. A restore waits
// for the page on its way (paged): read before a loss of commits, it
// must not reach the stream after the restore's read, beside the entries
// the lane then gives the same sequences, nor its deletion take theirs.
func (a *appender) drainPage(ctx context.Context, drained *int) (done bool, err error) {
	paging := make(chan struct{})
	a.mu.Lock()
	a.paging = paging
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.paging = nil
		a.mu.Unlock()
		close(paging)
	}()
	msgs, err := a.spill.Spilled(ctx, a.queue, drainPage)
	if err != nil {
		return false, err
	}
	a.mu.Lock()
	gone := a.gone(msgs, len(msgs) < drainPage)
	a.mu.Unlock()
	if len(gone) > 0 {
		if err := a.vanished(ctx, gone); err != nil {
			return false, err
		}
	}
	if len(msgs) == 0 {
		a.mu.Lock()
		if a.kept == 0 {
			if *drained > 0 {
				a.log.Info("journal: the stream took every entry kept in the database", "queue", a.queue, "entries", *drained)
			}
			a.drainFail = 0
		}
		a.mu.Unlock()
		return true, nil
	}
	write, cancel := context.WithTimeout(ctx, a.keepAfter)
	err = a.j.write(write, a.queue, msgs)
	cancel()
	if err != nil {
		a.failed()
		return false, err
	}
	if err := a.spill.Unspill(ctx, a.queue, msgs[len(msgs)-1].Last); err != nil {
		return false, err
	}
	// Only what it counts comes off the count: a message another writer
	// kept (a handover) is counted by that writer.
	page := runsOf(msgs)
	a.mu.Lock()
	taken := a.runs.within(page).count()
	a.runs = a.runs.without(page)
	a.kept = a.runs.count()
	a.mu.Unlock()
	*drained += taken
	a.unprotected(-taken)
	return false, nil
}
