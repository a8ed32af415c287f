package consumer

import (
	"context"
	"slices"
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
