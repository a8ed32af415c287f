package retry

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Until tries until try succeeds, telling failed of each failure with its
// attempt and the delay before the next, and stops when its context ends.
func TestUntilTriesUntilItSucceedsOrItsContextEnds(t *testing.T) {
	b := Backoff{Min: time.Millisecond, Max: 2 * time.Millisecond}
	calls := 0
	var attempts []int
	n, err := Until(t.Context(), b, func() error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return nil
	}, func(attempt int, _ error, delay time.Duration, _ bool) {
		if delay <= 0 || delay > b.Max {
			t.Errorf("attempt %d: delay %s out of %s", attempt, delay, b.Max)
		}
		attempts = append(attempts, attempt)
	})
	if n != 3 || err != nil || len(attempts) != 2 || attempts[0] != 1 || attempts[1] != 2 {
		t.Fatalf("%d attempts, %v, failures told %v; want 3, nil, [1 2]", n, err, attempts)
	}
	ctx, cancel := context.WithCancelCause(t.Context())
	stop := errors.New("stopped")
	_, err = Until(ctx, b, func() error { return errors.New("never") }, func(attempt int, _ error, _ time.Duration, _ bool) {
		if attempt == 2 {
			cancel(stop)
		}
	})
	if !errors.Is(err, stop) {
		t.Fatalf("%v, want the context's cause", err)
	}
}
