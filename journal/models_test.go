package journal

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"transferconsumer/event"
)

// The models the journal's tests run a lane against: the database's side
// of a lane and the journal's stream, and the helpers that apply through
// a lane as the worker does.

// database is a model of the database's side of a lane: the events it
// applied, in order, and each queue's mark, moved as journal_advance moves
// it. lose takes back its last commits, as a failover to a standby behind
// or a restore does.
type database struct {
	applied []string // event ids, in the order applied
	mark    int64
	at      time.Time
	commits []commit // to take back
	refuse  map[string]error
	conflic map[string]bool // answered as a producer conflict, committed
	down    error
	before  func() // runs once, at the next ApplyMarked
	txs     int    // transactions that applied events
}

type commit struct {
	mark    int64
	at      time.Time
	applied int
}

func (d *database) lose(n int) {
	c := d.commits[len(d.commits)-n]
	d.commits = d.commits[:len(d.commits)-n]
	d.mark, d.at, d.applied = c.mark, c.at, d.applied[:c.applied]
}

type modelLane struct{ db *database }

func (l modelLane) Apply(ctx context.Context, ev event.Event) (event.Result, error) {
	panic("the journal's lane applies through ApplyMarked")
}

func (l modelLane) Close() {}

func (l modelLane) Marked(context.Context, string) (int64, time.Time, error) {
	if l.db.down != nil {
		return 0, time.Time{}, l.db.down
	}
	return l.db.mark, l.db.at, nil
}

func (l modelLane) ApplyMarked(_ context.Context, evs []event.Event, m event.Mark) ([]event.Outcome, error) {
	d := l.db
	if f := d.before; f != nil {
		d.before = nil
		f()
	}
	if d.down != nil {
		return nil, event.Transient(d.down)
	}
	if d.mark != m.Prev {
		return nil, event.Transient(fmt.Errorf("%w: holds %d, went on from %d", event.ErrJournalGap, d.mark, m.Prev))
	}
	outs := make([]event.Outcome, len(evs))
	for _, ev := range evs {
		if err := d.refuse[ev.ID]; err != nil {
			return nil, err
		}
	}
	d.commits = append(d.commits, commit{d.mark, d.at, len(d.applied)})
	if len(evs) > 0 {
		d.txs++
	}
	for i, ev := range evs {
		switch {
		case d.conflic[ev.ID]:
			outs[i].Err = event.Conflict(errors.New("conflict"))
		case slices.Contains(d.applied, ev.ID):
			outs[i].Duplicate = true
		default:
			d.applied = append(d.applied, ev.ID)
		}
	}
	d.mark, d.at = m.Last, time.Now()
	return outs, nil
}

// stream is a model of the journal's stream: its entries in order, and
// the sequences its retention took.
type stream struct {
	entries []Entry
	head    time.Time // when its first entry was written
	reads   int
	page    int    // entries per page; 2 when 0
	atPage  func() // runs before each page is handed over

	// The lane's appender writes from a goroutine of its own: the
	// failure to answer with and the writes refused go by mu.
	mu      sync.Mutex
	fail    error
	refused int
}

// refuse has every write fail with err from now on (nil: none).
func (s *stream) refuse(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = err
}

func (s *stream) refusals() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused
}

func (s *stream) Append(_ context.Context, entries []Entry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		s.refused++
		return s.fail
	}
	if s.head.IsZero() {
		s.head = time.Now()
	}
	s.entries = append(s.entries, entries...)
	return nil
}

// readAll hands over pages of two entries, unless told otherwise, so that
// restores cross pages.
func (s *stream) readAll(_ context.Context, since time.Time, wants map[string]*want) error {
	s.reads++
	size := cmp.Or(s.page, 2)
	page := func(w *want) {
		if s.atPage != nil {
			s.atPage()
		}
		w.err = w.page(w.found)
		w.found.Entries = nil
	}
	for _, w := range wants {
		w.found = Found{Tail: w.after, FromStart: since.IsZero(), Head: s.head}
	}
	for _, e := range s.entries {
		w := wants[e.Queue]
		if w == nil || w.err != nil {
			continue
		}
		f := &w.found
		if f.First == 0 {
			f.First = e.Seq
		}
		f.Tail = max(f.Tail, e.Seq)
		if e.Seq > w.after {
			f.Entries = append(f.Entries, e)
		}
		if len(f.Entries) == size {
			page(w)
		}
	}
	for _, w := range wants {
		if w.err == nil && len(w.found.Entries) > 0 {
			page(w)
		}
	}
	return nil
}

// trim drops the stream's first n entries, as its retention does.
func (s *stream) trim(n int) {
	s.entries = s.entries[n:]
	s.head = time.Now()
}

func newLane(db *database, s *stream) *Lane {
	return makeLane(s, "q.0", modelLane{db}, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

func events(n int) []event.Event {
	out := make([]event.Event, n)
	for i := range out {
		out[i] = event.Event{ID: fmt.Sprintf("ev-%03d", i), Type: "TransferCreated"}
	}
	return out
}

// ids are evs' event ids, in order.
func ids(evs []event.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.ID
	}
	return out
}

// applyBatch applies evs as the worker does, and waits, as its ack does,
// until their entries are confirmed.
func applyBatch(t *testing.T, l *Lane, evs []event.Event) ([]event.Outcome, error) {
	t.Helper()
	outs, err := l.ApplyBatch(t.Context(), evs)
	if err == nil {
		waitJournaled(t, l)
	}
	return outs, err
}

// waitJournaled waits until l's entries are confirmed, for a minute at most.
func waitJournaled(t *testing.T, l *Lane) {
	t.Helper()
	if c := l.Journaled(); c != nil {
		select {
		case <-c:
		case <-time.After(time.Minute):
			t.Fatal("the entries were not confirmed within a minute")
		}
	}
}

func applyAll(t *testing.T, l *Lane, evs []event.Event, batch int) {
	t.Helper()
	for i := 0; i < len(evs); i += batch {
		if _, err := applyBatch(t, l, evs[i:min(i+batch, len(evs))]); err != nil {
			t.Fatal(err)
		}
	}
}
