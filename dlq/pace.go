package dlq

import (
	"time"

	"golang.org/x/time/rate"
)

// DefaultRate is the letters per second a replay puts back unless told
// otherwise: a fifth of the slowest rate the service was measured to apply
// at (365 events/s, BATCH_MAX=1, BENCHMARKS.md), so that a large group
// goes back beside live traffic without taking the queues from it; 5,000
// letters take under a minute (adr/0015).
const DefaultRate = 100

// Pace is how fast a replay goes, and whom it tells.
type Pace struct {
	// Rate is the most letters a second it publishes; 0 or less: as fast
	// as the broker confirms them. It never publishes faster, bursts
	// included: the token bucket holds one letter.
	Rate float64
	// Progress, when set, is told after each letter replayed.
	Progress func(Progress)
}

// Progress is how far a replay is.
type Progress struct {
	Replayed int // confirmed and removed
	Scanned  int // letters read, of Depth
	Depth    int // letters the DLQ held when the run started
	Elapsed  time.Duration
}

// Rate returns the letters replayed per second so far, 0 before any time
// has passed.
func (p Progress) Rate() float64 {
	if p.Elapsed <= 0 {
		return 0
	}
	return float64(p.Replayed) / p.Elapsed.Seconds()
}

// limiter returns the token bucket for p's rate, nil for no limit.
func (p Pace) limiter() *rate.Limiter {
	if p.Rate <= 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(p.Rate), 1)
}
