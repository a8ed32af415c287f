package dlq

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Letter is one dead letter as a person triaging the DLQ needs to see it.
type Letter struct {
	EventID string
	Class   string // x-failure-class, or the broker's reason (delivery_limit, rejected, …)
	Reason  string
	// Group is the failure's fingerprint: its x-failure-group, else (a
	// letter dead-lettered by the broker, or by a release before the
	// header) Fingerprint of its class and reason, computed the same way.
	Group      string
	Queue      string // where it failed
	RoutingKey string // the original routing key, which replay uses
	FailedAt   time.Time
	// DeadSince is the earliest time its headers show the letter was a
	// dead letter: its x-failed-at, the time of each of its x-death
	// entries (the broker's, one per queue and reason, each of its first
	// death there), and its x-replayed-at (a replay put it back, so it had
	// failed before). Zero when they show none: x-first-death-* and
	// x-last-death-* carry no time.
	DeadSince time.Time
	// Replays is how often Replay put the letter back (x-replay-count;
	// 1 for a letter with only x-replayed-at, put back by a release
	// before the count), LastReplay when last (x-replayed-at).
	Replays    int64
	LastReplay time.Time
}

// Describe reads a dead letter's headers: the service's own when it
// dead-lettered the message, else the broker's x-death when the broker did
// (delivery limit reached, or a reject without requeue).
func Describe(d amqp.Delivery) Letter {
	l := describe(d)
	l.Group = group(d.Headers, l)
	l.Replays, l.LastReplay = replays(d.Headers)
	l.DeadSince = deadSince(d.Headers)
	return l
}

func describe(d amqp.Delivery) Letter {
	l := Letter{EventID: d.MessageId, RoutingKey: d.RoutingKey}
	if l.EventID == "" {
		var body struct {
			EventID string `json:"eventId"`
		}
		if json.Unmarshal(d.Body, &body) == nil {
			l.EventID = body.EventID
		}
	}
	if class, ok := d.Headers[HeaderClass].(string); ok {
		l.Class = class
		l.Reason, _ = d.Headers[HeaderReason].(string)
		l.Queue, _ = d.Headers[HeaderOriginalQueue].(string)
		if key, ok := d.Headers[HeaderOriginalKey].(string); ok {
			l.RoutingKey = key
		}
		if at, ok := d.Headers[HeaderFailedAt].(string); ok {
			l.FailedAt, _ = time.Parse(time.RFC3339Nano, at)
		}
		return l
	}
	// Dead-lettered by the broker: x-death is newest first.
	if deaths, ok := d.Headers["x-death"].([]interface{}); ok && len(deaths) > 0 {
		if death, ok := deaths[0].(amqp.Table); ok {
			l.Class, _ = death["reason"].(string)
			l.Queue, _ = death["queue"].(string)
			l.FailedAt, _ = death["time"].(time.Time)
			count, _ := death["count"].(int64)
			l.Reason = fmt.Sprintf("dead-lettered by the broker (%s) from %s, %d time(s)", l.Class, l.Queue, count)
			if keys, ok := death["routing-keys"].([]interface{}); ok && len(keys) > 0 {
				if key, ok := keys[0].(string); ok {
					l.RoutingKey = key
				}
			}
		}
		return l
	}
	l.Class, l.Reason = "unknown", "no failure headers"
	return l
}

// group returns the fingerprint a letter carries, when the service
// dead-lettered it (its class header is there), else the one computed
// from its class and reason.
func group(headers amqp.Table, l Letter) string {
	if _, ours := headers[HeaderClass].(string); ours {
		if g, ok := headers[HeaderGroup].(string); ok && g != "" {
			return g
		}
	}
	return Fingerprint(l.Class, l.Reason)
}

// replays returns how often headers say a letter was put back, and when
// last.
func replays(headers amqp.Table) (int64, time.Time) {
	var last time.Time
	if s, ok := headers[HeaderReplayedAt].(string); ok {
		last, _ = time.Parse(time.RFC3339Nano, s)
	}
	n := ReplayCount(headers)
	if n == 0 && !last.IsZero() {
		n = 1
	}
	return n, last
}

// deadSince returns the earliest of the times headers show a dead letter
// had failed by, zero when they show none.
func deadSince(headers amqp.Table) time.Time {
	var first time.Time
	see := func(at time.Time) {
		if !at.IsZero() && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	for _, k := range []string{HeaderFailedAt, HeaderReplayedAt} {
		if s, ok := headers[k].(string); ok {
			if at, err := time.Parse(time.RFC3339Nano, s); err == nil {
				see(at)
			}
		}
	}
	if deaths, ok := headers["x-death"].([]interface{}); ok {
		for _, x := range deaths {
			if death, ok := x.(amqp.Table); ok {
				if at, ok := death["time"].(time.Time); ok {
					see(at)
				}
			}
		}
	}
	return first
}

// Classes returns every class Describe can give a letter: the service's
// own dead-letter classes (x-failure-class), the reasons the broker writes
// in x-death when it dead-letters a message itself, and unknown for a
// letter with neither header.
func Classes() []string {
	return []string{
		"poison", "producer-conflict", "invalid-transition", "data-rejected", "unauthorized", "panic",
		"rejected", "expired", "maxlen", "delivery_limit",
		"unknown",
	}
}

// Unreplayable reports whether a letter of class cannot apply however often
// it is replayed: a poison message fails the same way on the same body, and
// a producer conflict's eventId was applied with other content, which the
// inbox finds again (and once the inbox has forgotten it, a replay would
// apply a second transfer under one id). An unauthorized letter applies only
// once a person has put its producer in PRODUCERS, a decision no unfiltered
// replay should take for them; naming the class replays it, and its first
// producer is judged again (adr/0008), so a replay cannot launder it. Replay
// leaves them alone unless its filter names their class. Data the database rejects may apply after a fix
// of the schema or the code, an invalid transition once the transfer it
// moves arrives, a panic after a fix, and the broker's own dead letters
// (delivery_limit, rejected) and unknown ones are not judged by their body.
func Unreplayable(class string) bool {
	return class == "poison" || class == "producer-conflict" || class == "unauthorized"
}

// Filter selects dead letters. Empty fields match everything.
type Filter struct {
	Class   string // exact
	Reason  string // substring of the reason
	EventID string // exact
	Group   string // exact: the fingerprint (Letter.Group)
	// FailedAfter, when set, leaves out letters that failed before it. A
	// letter older than the inbox retention may be an event that was
	// applied and whose inbox row is gone: replaying it would apply it again.
	// A letter is judged by the earliest time it is known to have been a
	// dead letter (DeadSince), and one that shows no time at all is left
	// out too: nothing says it is recent.
	FailedAfter time.Time
}

// Match reports whether l passes the filter.
func (f Filter) Match(l Letter) bool {
	return f.selects(l) && (f.FailedAfter.IsZero() || l.since().After(f.FailedAfter))
}

// selects reports whether l passes the filter but for FailedAfter.
func (f Filter) selects(l Letter) bool {
	return (f.Class == "" || f.Class == l.Class) &&
		(f.Reason == "" || strings.Contains(l.Reason, f.Reason)) &&
		(f.EventID == "" || f.EventID == l.EventID) &&
		(f.Group == "" || f.Group == l.Group)
}

// since is the time l is judged by: DeadSince, else (a Letter not made by
// Describe) FailedAt; zero when neither is known.
func (l Letter) since() time.Time {
	if !l.DeadSince.IsZero() {
		return l.DeadSince
	}
	return l.FailedAt
}
