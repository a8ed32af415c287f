// Package retry paces what is tried again: the delay before the next
// attempt (Backoff) and when a failure that repeats is worth another log
// line (Throttle). The consumer, the database's start-up and the broker's
// reconnects share it; it depends on nothing of theirs.
package retry

import (
	"math/rand/v2"
	"time"
)

// Backoff is a capped, jittered exponential delay.
type Backoff struct {
	Min, Max time.Duration
}

// Delay returns the wait before retry number attempt (0-based): Min doubled
// per attempt, capped at Max, then drawn uniformly from its upper half so
// that many consumers retrying together spread out.
func (b Backoff) Delay(attempt int) time.Duration {
	d := b.Min
	for i := 0; i < attempt && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2)
}
