package db

import (
	"testing"
	"time"
)

// A lane's timer can fire just as an attempt ends; by the time its callback
// runs, the next attempt may be running. The callback must then leave the
// statement alone: its deadline is ahead. (Were the cancel sent, the nil
// pool would panic here.)
func TestLaneTimerLeavesTheNextAttemptAlone(t *testing.T) {
	l := &lane{in: &Inbox{}, timeout: time.Second}
	l.active, l.deadline = true, time.Now().Add(time.Hour)
	l.cancel(true)
	if l.cancelled {
		t.Error("a stale timer cancelled an attempt whose deadline is ahead")
	}
	l.active, l.deadline = false, time.Now().Add(-time.Second)
	l.cancel(true)
	l.cancel(false)
	if l.cancelled {
		t.Error("a cancel went out with no transaction running")
	}
}
