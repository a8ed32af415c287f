package journal

import (
	"context"
	"fmt"
	"time"
)

// A lane's entries on their way to the stream, and those its writer keeps
// in the database: what a restore waits for (flushLost), and what a
// closed lane leaves the queue's next one (keptCount, drainKept).

// flushLost has the lane's own entries on their way go to the stream
// first when the database lost the commits of some of them (its mark is
// below them: a failover, a restore), so that the read restores them with
// the rest. A stream that does not take them holds the restore only so
// long: the worker's retry waits its backoff, visibly, and comes back.
//
// Entries at or below the mark need no waiting: the read looks for what
// is above it. Nor do those kept in the database, which keeps an entry
// only while it holds its commit (event.JournalSpill). So a handover, a
// COMMIT's answer lost, or a restart while an alarm holds the stream,
// none of which lost a commit, restore at once instead of waiting for the
// alarm to pass.
//
// A page of kept entries on its way to the stream is waited for first
// (paged), a write's timeout at most: read before the loss, its entries
// would otherwise reach the stream after the restore's read, beside those
// the lane then gives their sequences again, and its deletion take
// theirs from the database.
func (l *Lane) flushLost(ctx context.Context) error {
	if err := l.out.paged(ctx); err != nil {
		return err
	}
	if l.out.journaled() == nil {
		return nil
	}
	mark, _, err := l.inner.Marked(ctx, l.queue)
	if err != nil {
		return err
	}
	if !l.out.unheldAbove(mark) {
		return nil
	}
	flush, cancel := context.WithTimeout(ctx, flushFor)
	err = l.out.flush(flush)
	cancel()
	if err != nil {
		return fmt.Errorf("journal: the entries on their way to %s's journal, above the database's mark %d, were not confirmed within %s: %w",
			l.queue, mark, flushFor, err)
	}
	return nil
}

// flushFor bounds how long a restore waits for the lane's own entries on
// their way to the stream (a variable only so that the fault schedules'
// test waits less).
var flushFor = 10 * time.Second

// unheldAbove reports whether entries above mark are on their way, held
// neither by the stream nor in the database.
func (a *appender) unheldAbove(mark int64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.unheld() != nil && a.top > mark
}

// paged waits until no page of kept messages is on its way to the
// stream (drainPage), or ctx ends.
func (a *appender) paged(ctx context.Context) error {
	a.mu.Lock()
	paging := a.paging
	a.mu.Unlock()
	if paging == nil {
		return nil
	}
	select {
	case <-paging:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// drainKept has the writer try the stream now for the entries kept in the
// database, or look for some first (it has not looked yet: a crash, or a
// former lane of the queue, may have left some), without waiting for it.
func (a *appender) drainKept() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.drainKeptLocked()
}

func (a *appender) drainKeptLocked() {
	if a.spill != nil && (a.wake == nil || a.kept != 0) {
		a.start()
		a.drainAt = time.Time{}
	}
}

// keptCount is how many entries the writer counts kept in the database;
// -1 when it has not looked. Once the lane closed.
func (a *appender) keptCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.spill == nil {
		return 0
	}
	if a.wake == nil {
		return -1
	}
	return a.kept
}

// flush waits until every entry queued so far is in the stream, those kept
// in the database included, or ctx ends.
func (a *appender) flush(ctx context.Context) error {
	a.mu.Lock()
	a.drainKeptLocked()
	idle := a.idle
	if !a.running {
		idle = nil
	}
	a.mu.Unlock()
	if idle != nil {
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
