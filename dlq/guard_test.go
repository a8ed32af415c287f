package dlq

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The INBOX_TTL guard of a replay judges each letter by the earliest time
// it is known to have been a dead letter, whoever dead-lettered it, and
// leaves alone a letter with no time at all, unless the guard is off
// (--include-older-than-ttl: FailedAfter zero).
func TestReplayGuardJudgesEveryLetterByTheBestTimeItHas(t *testing.T) {
	now := time.Now()
	ttl := 720 * time.Hour
	recent, old := now.Add(-time.Hour), now.Add(-ttl-time.Hour)
	stamp := func(at time.Time) string { return at.UTC().Format(time.RFC3339Nano) }
	death := func(reason string, at time.Time) amqp.Table {
		return amqp.Table{"reason": reason, "queue": "transfers.0", "count": int64(1), "time": at,
			"exchange": "transfers", "routing-keys": []any{"acc_00001"}}
	}
	service := func(h amqp.Table) amqp.Table {
		h[HeaderClass], h[HeaderReason], h[HeaderOriginalKey] = "data-rejected", "bad", "acc_00001"
		return h
	}
	tests := []struct {
		name    string
		headers amqp.Table
		safe    bool
	}{
		{"the service's, failed recently", service(amqp.Table{HeaderFailedAt: stamp(recent)}), true},
		{"the service's, failed long ago", service(amqp.Table{HeaderFailedAt: stamp(old)}), false},
		{"the service's, without x-failed-at", service(amqp.Table{}), false},
		{"the service's, x-failed-at unreadable", service(amqp.Table{HeaderFailedAt: "yesterday"}), false},
		{"the service's, x-failed-at unreadable, x-death recent",
			service(amqp.Table{HeaderFailedAt: "yesterday", "x-death": []any{death("rejected", recent)}}), true},
		{"the service's, failed recently, put back by a replay long ago",
			service(amqp.Table{HeaderFailedAt: stamp(recent), HeaderReplayedAt: stamp(old)}), false},
		{"the broker's, recently", amqp.Table{"x-death": []any{death("delivery_limit", recent)}}, true},
		{"the broker's, long ago", amqp.Table{"x-death": []any{death("delivery_limit", old)}}, false},
		{"the broker's, twice: recently, and first long ago",
			amqp.Table{"x-death": []any{death("delivery_limit", recent), death("rejected", old)}}, false},
		{"the broker's, x-death without a time", amqp.Table{"x-death": []any{amqp.Table{"reason": "rejected", "count": int64(1)}},
			"x-first-death-reason": "rejected", "x-first-death-queue": "transfers.0"}, false},
		{"the broker's, put back by a replay recently, x-death recent",
			amqp.Table{"x-death": []any{death("delivery_limit", recent)}, HeaderReplayedAt: stamp(recent.Add(-time.Minute))}, true},
		{"no failure headers at all", amqp.Table{}, false},
		{"no headers at all", nil, false},
	}
	guard := Filter{FailedAfter: now.Add(-ttl)}
	r := ReplayReport{Run: "run"}
	held := 0
	for _, tt := range tests {
		d := amqp.Delivery{MessageId: "3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10", RoutingKey: "acc_00001", Headers: tt.headers}
		l := Describe(d)
		if got := replayable(d, l, guard, "run"); got != tt.safe {
			t.Errorf("%s: replayed under the guard: %v, want %v (letter %+v)", tt.name, got, tt.safe, l)
		}
		if !replayable(d, l, Filter{}, "run") {
			t.Errorf("%s: not replayed with the guard off", tt.name)
		}
		if r.shouldReplay(d, l, guard) != tt.safe {
			t.Errorf("%s: judged otherwise than replayable", tt.name)
		}
		if !tt.safe {
			held++
		}
	}
	if r.TooOld+r.Undated != held || r.Undated != 5 {
		t.Errorf("the report counts %d too old and %d undated, want %d held back, 5 of them undated", r.TooOld, r.Undated, held)
	}
	if (&ReplayReport{Run: "run"}).shouldReplay(amqp.Delivery{}, Letter{Class: "unknown"}, Filter{Class: "poison", FailedAfter: now}) {
		t.Error("a letter of another class replayed")
	}
}
