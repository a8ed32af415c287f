package journal

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"transferconsumer/event"
)

// What the writer keeps in the database, by sequence, and what it says
// when kept entries are gone from there (adr/0014, "When the stream does
// not take the entries").
//
// The database keeps a journal message only while its mark is at or past
// the message's last entry, in a transaction after the commits of its
// entries (db Spill), and only the writers delete one, once the stream
// confirmed it. So a kept message that is gone was taken to the stream by
// a writer (the queue's writer in another replica, after a handover), or
// went with a loss of commits (a failover, a restore): that loss took
// back its entries' commits too when the mark is now below them, and
// then those entries are in neither the stream nor the database, unless
// a write of them that timed out reached the stream after all. Which of
// the two a restore tells: it reads the stream above the mark, applies
// what it finds there, and the lane goes on from where the database and
// the journal together reach (Lane.prev). So entries gone above the mark
// wait for the lane's next read of the journal (doubt), and those above
// where it then goes on from are lost, counted (Reports.Lost) and logged
// as such.
//
// Reading the mark after finding the messages gone is safe against the
// other writers: a writer moves no mark and deletes only what the stream
// confirmed, and the mark moves only forward from what the database
// holds, except when commits are taken back. Messages another writer
// took are thus at or below the mark whenever it is read after; a mark
// below them means a loss. It is not safe against this lane's worker:
// after a loss and its restore, the worker's next commit takes the lost
// entries' sequences again and moves the mark past them. So the worker
// tells the writer of each commit on its way (committing), the writer
// decides nothing while one goes on from below entries it finds gone,
// and a commit that went on from below kept entries says they are lost
// itself (committed): it went on from a mark the database held, after a
// read of the journal.

// keptRun is a run of kept sequences, first … last, and when its first
// entry was kept (by this process, or as the database says).
type keptRun struct {
	first, last int64
	at          time.Time
}

// keptRuns are sequences in ascending runs that neither overlap nor
// touch. Each operation returns new runs, and leaves its operands as
// they were.
type keptRuns []keptRun

func (r keptRuns) count() int {
	n := 0
	for _, k := range r {
		n += int(k.last - k.first + 1)
	}
	return n
}

// top is the highest sequence of r; 0 when r is empty.
func (r keptRuns) top() int64 {
	if len(r) == 0 {
		return 0
	}
	return r[len(r)-1].last
}

// since is when the first of r's runs was kept.
func (r keptRuns) since() time.Time {
	var at time.Time
	for _, k := range r {
		if at.IsZero() || k.at.Before(at) {
			at = k.at
		}
	}
	return at
}

// with returns r and o together, runs that overlap or touch merged (the
// earlier time kept).
func (r keptRuns) with(o ...keptRun) keptRuns {
	all := slices.SortedFunc(slices.Values(append(slices.Clone(r), o...)), func(a, b keptRun) int {
		switch {
		case a.first < b.first:
			return -1
		case a.first > b.first:
			return 1
		}
		return 0
	})
	var out keptRuns
	for _, k := range all {
		if n := len(out); n > 0 && k.first <= out[n-1].last+1 {
			prev := &out[n-1]
			prev.last = max(prev.last, k.last)
			if k.at.Before(prev.at) {
				prev.at = k.at
			}
			continue
		}
		out = append(out, k)
	}
	return out
}

// cut returns r without the sequences first … last (rest), and r's
// sequences among them (in).
func (r keptRuns) cut(first, last int64) (rest, in keptRuns) {
	for _, k := range r {
		if k.last < first || k.first > last {
			rest = append(rest, k)
			continue
		}
		if k.first < first {
			rest = append(rest, keptRun{k.first, first - 1, k.at})
		}
		in = append(in, keptRun{max(k.first, first), min(k.last, last), k.at})
		if k.last > last {
			rest = append(rest, keptRun{last + 1, k.last, k.at})
		}
	}
	return rest, in
}

// within returns r's sequences that are also o's.
func (r keptRuns) within(o keptRuns) keptRuns {
	var out keptRuns
	for _, k := range o {
		_, in := r.cut(k.first, k.last)
		out = append(out, in...)
	}
	return out
}

// without returns r's sequences that are not o's.
func (r keptRuns) without(o keptRuns) keptRuns {
	for _, k := range o {
		r, _ = r.cut(k.first, k.last)
	}
	return r
}

// above splits r at mark: the sequences at or below it, and those above.
func (r keptRuns) above(mark int64) (atOrBelow, over keptRuns) {
	return r.cut(mark+1, math.MaxInt64)
}

// String writes r as its logs name them: "5-7, 9".
func (r keptRuns) String() string {
	var b strings.Builder
	for i, k := range r {
		if i > 0 {
			b.WriteString(", ")
		}
		if k.first == k.last {
			fmt.Fprint(&b, k.first)
		} else {
			fmt.Fprintf(&b, "%d-%d", k.first, k.last)
		}
	}
	return b.String()
}

// runsOf returns the sequences of msgs, kept now.
func runsOf(msgs []event.Spilled) keptRuns {
	now := time.Now()
	runs := make([]keptRun, len(msgs))
	for i, m := range msgs {
		runs[i] = keptRun{m.First, m.Last, now}
	}
	return keptRuns(nil).with(runs...)
}

// keep counts msgs, just kept in the database, as kept, and returns how
// many entries that adds. Under mu.
func (a *appender) keep(msgs []event.Spilled) int {
	before := a.kept
	a.runs = a.runs.with(runsOf(msgs)...)
	a.kept = a.runs.count()
	return a.kept - before
}

// gone returns the entries the writer counts kept whose messages are not
// among msgs, the oldest the database keeps now (all of them when all):
// those below the first of msgs, and, with all, every other one msgs do
// not hold. Under mu.
func (a *appender) gone(msgs []event.Spilled, all bool) keptRuns {
	if all {
		return a.runs.without(runsOf(msgs))
	}
	if len(msgs) == 0 {
		return nil
	}
	_, below := a.runs.cut(math.MinInt64, msgs[0].First-1)
	return below
}

// vanished settles the kept entries whose messages the database no
// longer keeps (gone): those at or below its mark are held by the
// database, and are no longer counted; those above it went with their
// commits, and wait for the lane's next read of the journal (settle),
// counted meanwhile. While a commit of the lane's own goes on from below
// some of them, it decides nothing (see above), and the writer looks
// again after its backoff.
func (a *appender) vanished(ctx context.Context, gone keptRuns) error {
	mark, err := a.spill.Mark(ctx, a.queue)
	if err != nil {
		return err
	}
	a.mu.Lock()
	gone = a.runs.within(gone) // what the worker's commit settled meanwhile is no longer counted
	if a.going && a.goingFrom < gone.top() {
		a.mu.Unlock()
		a.failed()
		return nil
	}
	a.runs = a.runs.without(gone)
	a.kept = a.runs.count()
	held, above := gone.above(mark)
	a.doubt = a.doubt.with(above...)
	a.mu.Unlock()
	if len(held) > 0 {
		a.log.Info("journal: entries kept in the database are gone from it, and the database holds their commits: "+
			"another writer of the queue took them to the stream (a handover), or the database came back to a point after "+
			"their commits but before they were kept (the stream then lacks them, and nothing is lost)",
			"queue", a.queue, "seqs", held.String(), "entries", held.count(), "mark", mark)
		a.unprotected(-held.count())
	}
	if len(above) > 0 {
		a.log.Warn("journal: entries kept in the database are gone from it with their commits (a failover or a restore): "+
			"their events are lost unless the journal holds a copy, which the queue's next read of the journal tells",
			"queue", a.queue, "seqs", above.String(), "entries", above.count(), "mark", mark)
	}
	return nil
}

// committing tells the writer that the lane's worker commits from prev,
// the mark it holds the database at: until committed, the writer decides
// nothing about kept entries above prev that are gone.
func (a *appender) committing(prev int64) {
	if a.spill == nil {
		return
	}
	a.mu.Lock()
	a.going, a.goingFrom = true, prev
	a.mu.Unlock()
}

// committed ends committing; when the commit went on from prev (ok), the
// database held prev as the queue's mark after the lane's last read of
// the journal, so kept entries above prev are lost (settle). Both under
// one lock: the writer, which may have read the mark past them since the
// commit, must not find them counted kept in between.
func (a *appender) committed(prev int64, ok bool) {
	if a.spill == nil {
		return
	}
	a.mu.Lock()
	a.going = false
	var s settled
	if ok {
		s = a.settleLocked(prev)
	}
	a.mu.Unlock()
	a.report(s, prev)
}

// settle decides what the lane's read of the journal tells, once the
// lane goes on from prev, where the database and the journal together
// reach: the entries kept, or gone with their commits, above prev are in
// neither, and lost; those gone at or below it the restore applied again
// from the journal, which held a copy.
func (a *appender) settle(prev int64) {
	a.mu.Lock()
	s := a.settleLocked(prev)
	a.mu.Unlock()
	a.report(s, prev)
}

// settled is what settle decided: the entries a restore applied again,
// and those lost.
type settled struct{ restored, lost keptRuns }

// settleLocked is settle's decision, under mu.
func (a *appender) settleLocked(prev int64) settled {
	if a.runs.top() <= prev && len(a.doubt) == 0 {
		return settled{}
	}
	var s settled
	var keptAbove, doubtAbove keptRuns
	if a.kept > 0 {
		a.runs, keptAbove = a.runs.above(prev)
		a.kept = a.runs.count()
	}
	s.restored, doubtAbove = a.doubt.above(prev)
	a.doubt = nil
	s.lost = keptAbove.with(doubtAbove...)
	return s
}

// report logs and counts what settle decided.
func (a *appender) report(s settled, prev int64) {
	if len(s.restored) > 0 {
		a.log.Info("journal: entries kept in the database were gone from it with their commits, and the journal held them: "+
			"the restore applied them again, and nothing is lost",
			"queue", a.queue, "seqs", s.restored.String(), "entries", s.restored.count())
		a.unprotected(-s.restored.count())
	}
	a.lost(s.lost, prev, "")
}

// undecided settles, once the lane closed, what it knows and the queue's
// next lane will not: it looks once more for the entries it counts kept
// (a loss may have taken them since the writer last looked; the next
// lane's writer finds only what is still there), and says the entries
// gone with their commits that no read of the journal has settled are
// lost. A copy the journal holds of some is applied again by the next
// lane's restore, which logs it. A database that does not answer within
// keepAfter leaves the kept entries to the next lane's writer.
func (a *appender) undecided() {
	a.mu.Lock()
	look := a.spill != nil && a.kept > 0
	a.mu.Unlock()
	if look {
		ctx, cancel := context.WithTimeout(context.Background(), a.keepAfter)
		kept, err := a.spill.Kept(ctx, a.queue)
		if err == nil {
			var there keptRuns
			for _, r := range kept {
				there = there.with(keptRun{first: r.First, last: r.Last})
			}
			a.mu.Lock()
			gone := a.runs.without(there)
			a.mu.Unlock()
			if len(gone) > 0 {
				err = a.vanished(ctx, gone)
			}
		}
		cancel()
		if err != nil {
			a.log.Warn("journal: could not look whether the entries the closed lane kept in the database are still there; the queue's next lane's writer counts those it finds",
				"queue", a.queue, "err", err)
		}
	}
	a.mu.Lock()
	doubt := a.doubt
	a.doubt = nil
	a.mu.Unlock()
	a.lost(doubt, -1, "the lane closed before a read of the journal told whether it holds a copy of them; "+
		"a restore that applies one again logs it")
}

// lost reports runs lost: counted, no longer unprotected, and logged at
// ERROR with the sequences, the mark they are above (-1: not known) and
// since when they were kept: their events were acked once they were kept.
func (a *appender) lost(runs keptRuns, mark int64, note string) {
	n := runs.count()
	if n == 0 {
		return
	}
	args := []any{"queue", a.queue, "seqs", runs.String(), "entries", n, "kept_since", runs.since()}
	if mark >= 0 {
		args = append(args, "mark", mark)
	}
	if note != "" {
		args = append(args, "note", note)
	}
	a.log.Error("journal: acked events lost: their commits were taken back (a failover or a restore) "+
		"while their entries were kept only in the database", args...)
	a.unprotected(-n)
	if a.reports.Lost != nil {
		a.reports.Lost(a.queue, n)
	}
}

func (a *appender) unprotected(n int) {
	if n != 0 && a.reports.Unprotected != nil {
		a.reports.Unprotected(a.queue, n)
	}
}
