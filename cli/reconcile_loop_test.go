package cli

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// Both of the service's reconciliation loops, the periodic pass and the
// standby's full pass, tick through atEveryInterval: it calls the pass
// again and again, never two at once, and returns once ctx ends.
func TestAtEveryIntervalRunsOnePassAtATimeUntilTheEnd(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	var calls, running atomic.Int32
	third := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		atEveryInterval(ctx, time.Millisecond, func() {
			if running.Add(1) != 1 {
				t.Error("two passes at once")
			}
			defer running.Add(-1)
			if calls.Add(1) == 3 {
				close(third)
				cancel()
			}
		})
	}()
	select {
	case <-third:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d passes in 10 s at an interval of 1 ms, want 3", calls.Load())
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("atEveryInterval did not return once its context ended")
	}
}
