package retry

import (
	"testing"
	"time"
)

func TestBackoffStaysWithinBounds(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: 2 * time.Second}
	for attempt := 0; attempt < 20; attempt++ {
		ceiling := min(b.Min<<min(attempt, 30), b.Max)
		for i := 0; i < 50; i++ {
			d := b.Delay(attempt)
			if d < ceiling/2 || d > ceiling {
				t.Fatalf("Delay(%d) = %s, want within [%s, %s]", attempt, d, ceiling/2, ceiling)
			}
		}
	}
}
