package consumer

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"transferconsumer/dlq"
	"transferconsumer/event"
)

func TestDecide(t *testing.T) {
	tests := []struct {
		class event.Class
		want  Action
	}{
		{"", ActionAck},
		{event.ClassPoison, ActionDeadLetter},
		{event.ClassConflict, ActionDeadLetter},
		{event.ClassTransition, ActionDeadLetter},
		{event.ClassRejected, ActionDeadLetter},
		{event.ClassUnauthorized, ActionDeadLetter},
		{event.ClassTransient, ActionRetry},
		{event.ClassUnknown, ActionRetry},
		{event.ClassPanic, ActionRetry},
		{event.ClassShutdown, ActionRequeue},
	}
	for _, tt := range tests {
		if got := decide(tt.class); got != tt.want {
			t.Errorf("decide(%q) = %s, want %s", tt.class, got, tt.want)
		}
		if tt.want == ActionDeadLetter && !slices.Contains(dlq.Classes(), string(tt.class)) {
			t.Errorf("dlq.Classes() lacks %q: dlq replay --class would refuse its letters", tt.class)
		}
	}
}

// lanesApp hands out numbered lanes; a wrapping lane keeps what it wraps
// in inner.
type lanesApp struct{ made int }

func (a *lanesApp) Apply(context.Context, event.Event) (event.Result, error) {
	return event.Result{}, nil
}
func (a *lanesApp) Lane(time.Duration) event.Lane { a.made++; return &countedLane{n: a.made} }

type countedLane struct {
	n      int
	closed bool
	inner  event.Lane // for a wrapping lane
}

func (l *countedLane) Apply(context.Context, event.Event) (event.Result, error) {
	return event.Result{}, nil
}
func (l *countedLane) Close() { l.closed = true }

type wrappingLane struct{ countedLane }

func (l *wrappingLane) Renew(inner event.Lane) {
	l.inner.Close()
	l.inner = inner
}

// After a panic the worker's lane is replaced; a lane that wraps another
// (the journal's) keeps itself, and what it knows of the queue, and only
// what it wraps is replaced.
func TestAPanicRenewsOnlyWhatAWrappingLaneWraps(t *testing.T) {
	app := &lanesApp{}
	svc := &Service{app: app}
	plain := app.Lane(0).(*countedLane)
	w := &worker{svc: svc, lane: plain}
	w.renewLane()
	if !plain.closed || w.lane.(*countedLane).n != 2 {
		t.Fatalf("a plain lane was not closed and replaced")
	}
	first := app.Lane(0)
	wrap := &wrappingLane{countedLane{inner: first}}
	w.lane = wrap
	w.renewLane()
	if w.lane != event.Lane(wrap) || wrap.closed {
		t.Fatal("the wrapping lane was replaced or closed")
	}
	if !first.(*countedLane).closed || wrap.inner.(*countedLane).n != 4 {
		t.Fatalf("what the wrapping lane wraps was not closed and replaced")
	}
}

// journalLane stands for the journal's lane: its commits are acked once
// Journaled says so.
type journalLane struct{ event.Lane }

func (journalLane) Journaled() <-chan struct{} { return nil }

// With the journal, the prefetch is twice BATCH_MAX, so that the next
// batch (at BATCH_MAX 1, the next event) arrives while one's acks wait for
// the journal; without the journal, it is BATCH_MAX.
func TestThePrefetchMakesRoomForAcksThatWaitForTheJournal(t *testing.T) {
	for _, tt := range []struct {
		batchMax int
		lane     event.Lane
		want     int
	}{
		{0, nil, 1},
		{1, journalLane{}, 2},
		{50, nil, 50},
		{50, journalLane{}, 100},
	} {
		if got := prefetchFor(tt.batchMax, tt.lane); got != tt.want {
			t.Errorf("BATCH_MAX %d, lane %T: prefetch %d, want %d", tt.batchMax, tt.lane, got, tt.want)
		}
	}
}

// A queue whose journal stalls is reported blocked, as one its message in
// hand blocks is, once: the message's own report goes first; healed, the
// journal's report is gone.
func TestAStalledJournalBlocksItsQueueOnce(t *testing.T) {
	s := New(Config{}, nil)
	since := time.Now()
	s.JournalStalled("q.1", since, 3, "ev-1", errors.New("stream down"))
	got := s.State().Blocked
	if len(got) != 1 || got[0].Queue != "q.1" || got[0].EventID != "ev-1" || got[0].Attempts != 3 ||
		got[0].Class != event.ClassTransient || !strings.Contains(got[0].Reason, "journal") {
		t.Fatalf("blocked %+v; want q.1 blocked by its journal", got)
	}
	s.setBlocked(Blocked{Queue: "q.1", EventID: "ev-0", Class: event.ClassTransient, Reason: "database down", Attempts: 1})
	if got := s.State().Blocked; len(got) != 1 || got[0].EventID != "ev-0" {
		t.Fatalf("blocked %+v; want q.1 once, by its message in hand", got)
	}
	s.clearBlocked("q.1")
	s.JournalHealed("q.1")
	if got := s.State().Blocked; len(got) != 0 {
		t.Fatalf("blocked %+v after the journal healed; want none", got)
	}
}
