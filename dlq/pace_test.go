package dlq

import (
	"testing"
	"time"
)

// A replay's bucket holds one letter: in any span of d it lets at most
// 1 + d×rate letters go, so a run of n letters at rate r takes at least
// (n-1)/r. Told by the bucket's own clock, not the machine's speed.
func TestPaceNeverGoesFasterThanItsRate(t *testing.T) {
	lim := Pace{Rate: 50}.limiter()
	t0 := time.Date(2026, 7, 10, 12, 0, 0, 0, time.UTC)
	allowed := 0
	for ms := 0; ms < 1000; ms++ { // ask every millisecond for a second
		if lim.AllowN(t0.Add(time.Duration(ms)*time.Millisecond), 1) {
			allowed++
		}
	}
	if allowed > 50 {
		t.Errorf("%d letters in one second at 50/s", allowed)
	}
	if allowed < 49 {
		t.Errorf("%d letters in one second at 50/s: the bucket holds back more than its rate", allowed)
	}
	if (Pace{}).limiter() != nil || (Pace{Rate: -1}).limiter() != nil {
		t.Error("no rate: a limiter, want none")
	}
	if r := (Progress{Replayed: 10, Elapsed: 2 * time.Second}).Rate(); r != 5 {
		t.Errorf("rate %v, want 5", r)
	}
}
