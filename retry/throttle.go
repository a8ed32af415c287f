package retry

import "time"

// Throttle says when a failure that repeats is due to be logged: once per
// change of state (a first failure, another reason) and in between at a
// slowing rate, after the 1st, 2nd, 4th, 8th… attempt and at least every
// throttleQuietMax; never once per attempt.
type Throttle struct {
	next   int
	last   time.Time
	reason string
}

const throttleQuietMax = 5 * time.Minute

// Due records failed attempt n (1-based) with reason and reports whether
// to log it, and whether the reason changed from an earlier one.
func (t *Throttle) Due(n int, reason string) (due, changed bool) {
	now := time.Now()
	changed = t.reason != "" && reason != t.reason
	if n < t.next && reason == t.reason && now.Sub(t.last) < throttleQuietMax {
		return false, false
	}
	t.last, t.reason = now, reason
	for t.next <= n {
		t.next = max(1, 2*t.next)
	}
	return true, changed
}
