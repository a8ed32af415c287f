package journal

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// logged is a slog handler that keeps what is logged, for a test to read.
type logged struct {
	mu    sync.Mutex
	lines []string // level, message and attributes, as a text line
}

func (h *logged) Enabled(context.Context, slog.Level) bool { return true }

func (h *logged) Handle(_ context.Context, r slog.Record) error {
	line := r.Level.String() + " " + r.Message
	r.Attrs(func(a slog.Attr) bool {
		line += fmt.Sprintf(" %s=%v", a.Key, a.Value)
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lines = append(h.lines, line)
	return nil
}

func (h *logged) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logged) WithGroup(string) slog.Handler      { return h }

// with returns the lines logged at level whose message has text.
func (h *logged) with(level slog.Level, text string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, line := range h.lines {
		if strings.HasPrefix(line, level.String()+" ") && strings.Contains(line, text) {
			out = append(out, line)
		}
	}
	return out
}

// counts are a lane's Unprotected and Lost reports, summed.
type counts struct{ unprotected, lost atomic.Int64 }

func (c *counts) reports() Reports {
	return Reports{Unprotected: func(_ string, n int) { c.unprotected.Add(int64(n)) },
		Lost: func(_ string, n int) { c.lost.Add(int64(n)) }}
}

// loggedLane is newLaneWith's lane, its log kept in log.
func loggedLane(db *database, s *stream, cfg Config, log *logged) *Lane {
	if k, ok := cfg.Spill.(*spill); ok && k.db == nil {
		k.db = db
	}
	return makeLane(s, cfg, "q.0", modelLane{db}, slog.New(log))
}

// Entries kept in the database while the stream held every write, whose
// commits a failover then takes back with the kept rows: their events,
// acked, are in neither the stream nor the database. Once the lane read
// the journal again (the queue's next event, or the watch's check of the
// idle queue), exactly those entries are counted lost, taken off the
// unprotected gauge, and logged at ERROR with their sequences; a copy the
// stream holds after all (a write that timed out had reached it) is
// applied again by the restore, and not counted. Before, the writer took
// the vanished entries for taken by the stream: it logged so at INFO,
// counted nothing lost, and the gauge never came back to 0.
func TestKeptEntriesTakenBackWithTheirCommitsAreCountedLost(t *testing.T) {
	for _, tt := range []struct {
		name    string
		land    bool   // the writes the stream held reached it, unconfirmed
		idle    bool   // the watch's check reads the journal, not the next event
		lost    string // the sequences
		n       int64  // how many
		applied []int  // of evs
	}{
		{"the next event reads the journal", false, false, "2-4", 3, []int{0, 4}},
		{"the watch reads the journal of the idle queue", false, true, "2-4", 3, []int{0}},
		{"the stream holds a copy of the first", true, false, "3-4", 2, []int{0, 1, 4}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			db, s, k, log := &database{}, &stream{}, &spill{}, &logged{}
			var c counts
			l := loggedLane(db, s, Config{Spill: k, KeepAfter: keepAfter, Reports: c.reports()}, log)
			defer l.Close()
			evs := events(5)
			applyAll(t, l, evs[:1], 1)
			s.hold(tt.land)
			applyAll(t, l, evs[1:4], 1) // each kept after its commit: entries 2, 3, 4
			if n := k.kept(); n != 3 || c.unprotected.Load() != 3 {
				t.Fatalf("%d entries kept, %d unprotected; want 3 and 3", n, c.unprotected.Load())
			}
			if gone := db.loseKept(3, k); len(gone) != 3 || db.mark != 1 {
				t.Fatalf("the failover took %d kept messages back, mark %d; want 3 and 1", len(gone), db.mark)
			}
			s.let()
			waitFor(t, "the writer to find the kept entries gone", func() bool { return !l.out.busy() })
			if tt.idle {
				if _, err := l.Check(t.Context()); err != nil {
					t.Fatal(err)
				}
			} else {
				applyAll(t, l, evs[4:], 1)
			}
			var want []string
			for _, i := range tt.applied {
				want = append(want, evs[i].ID)
			}
			if !slices.Equal(db.applied, want) {
				t.Errorf("applied %v, want %v", db.applied, want)
			}
			if c.lost.Load() != tt.n || c.unprotected.Load() != 0 {
				t.Errorf("%d counted lost, %d unprotected; want %d (%s), 0", c.lost.Load(), c.unprotected.Load(), tt.n, tt.lost)
			}
			errs := log.with(slog.LevelError, "acked events lost")
			if len(errs) != 1 || !strings.Contains(errs[0], "queue=q.0") || !strings.Contains(errs[0], "seqs="+tt.lost+" ") {
				t.Errorf("logged at ERROR %q; want one line naming q.0 and %s", errs, tt.lost)
			}
			if took := log.with(slog.LevelInfo, "the stream took every entry"); len(took) > 0 {
				t.Errorf("logged %q", took)
			}
		})
	}
}

// Entries kept in the database, then taken to the stream by another
// writer of the queue (a replica's, after a handover): the rows are gone,
// and the database's mark is at or past them. Nothing is lost, and each
// writer's count of unprotected entries comes back to 0, whichever took
// them. Before, the writer that found them gone kept counting them.
func TestKeptEntriesAnotherWriterTookAreNotLost(t *testing.T) {
	db, s, k, log := &database{}, &stream{}, &spill{}, &logged{}
	var c, other counts
	l := loggedLane(db, s, Config{Spill: k, KeepAfter: keepAfter, Reports: c.reports()}, log)
	defer l.Close()
	evs := events(3)
	applyAll(t, l, evs[:1], 1)
	s.hold(false)
	applyAll(t, l, evs[1:3], 1)
	if n := k.kept(); n != 2 {
		t.Fatalf("%d entries kept; want 2", n)
	}
	// The other replica's lane of the queue, whose writer looks for kept
	// entries at once, as after a handover.
	b := loggedLane(db, s, Config{Spill: k, KeepAfter: keepAfter, Reports: other.reports()}, &logged{})
	defer b.Close()
	b.out.drainKept()
	waitFor(t, "the other writer to count the kept entries", func() bool { return other.unprotected.Load() == 2 })
	s.let()
	waitFor(t, "the kept entries in the stream", func() bool { return k.kept() == 0 })
	waitFor(t, "no entry counted unprotected by either writer", func() bool {
		return c.unprotected.Load() == 0 && other.unprotected.Load() == 0
	})
	if c.lost.Load() != 0 || other.lost.Load() != 0 || len(log.with(slog.LevelError, "")) > 0 {
		t.Errorf("%d and %d counted lost, logged %q; want none", c.lost.Load(), other.lost.Load(), log.with(slog.LevelError, ""))
	}
	s.mu.Lock()
	got := seqsOf(s.entries)
	s.mu.Unlock()
	slices.Sort(got)
	if got = slices.Compact(got); !slices.Equal(got, []int64{1, 2, 3}) {
		t.Errorf("the stream holds %v; want 1, 2 and 3", got)
	}
}
