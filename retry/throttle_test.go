package retry

import (
	"reflect"
	"testing"
	"time"
)

// A blocked queue is logged at its first failure, when the reason changes,
// and then after attempts 2, 4, 8, …: a stopped line is visible without a
// line per attempt.
func TestThrottleLogsAtASlowingRate(t *testing.T) {
	var th Throttle
	var logged []int
	for n := 1; n <= 40; n++ {
		reason := "connection refused"
		if n == 11 {
			reason = "database is not accepting connections"
		}
		if due, _ := th.Due(n, reason); due {
			logged = append(logged, n)
		}
	}
	want := []int{1, 2, 4, 8, 11, 12, 16, 32}
	if !reflect.DeepEqual(logged, want) {
		t.Errorf("logged attempts %v, want %v", logged, want)
	}

	// However slow the attempts, one is logged at least every quiet period.
	th = Throttle{}
	th.Due(1, "x")
	th.last = time.Now().Add(-throttleQuietMax)
	if due, _ := th.Due(3, "x"); !due {
		t.Error("attempt 3 after a quiet period was not logged")
	}
}
