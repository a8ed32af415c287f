package topology

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Check is what the last check of a topology made by others found.
type Check struct {
	// Status is "ok", or why the arguments were not checked, or "differs"
	// when there are Findings.
	Status   string
	Findings []Finding
	// NotConsumed are the partition queues the findings keep from being
	// consumed.
	NotConsumed []string
}

// uncheckedHint says how to have a topology made by others checked.
const uncheckedHint = "set MANAGEMENT_URL to the management API (a user with the management tag and access to the vhost): " +
	"the service then checks that its queues are quorum, with single active consumer, the delivery limit and " +
	"dead-lettering to a DLQ that keeps every letter, and does not consume a queue that would lose order or letters"

// Checker checks a topology made by others (DECLARE_TOPOLOGY=false) each
// time Run is called, and keeps what it found last. Without Management it
// checks nothing, and says so once.
type Checker struct {
	Spec       Spec
	Management *Management // nil: the arguments cannot be checked, which is said once
	Log        *slog.Logger

	last      atomic.Pointer[Check]
	unchecked sync.Once // said that the topology could not be checked
}

// Last returns what the last Run found, nil before the first.
func (c *Checker) Last() *Check { return c.last.Load() }

// Run checks the topology made by others through the management API,
// logs what differs from what the service needs when that changed since the
// last check, records it for Last, and returns the partition queues not
// to consume. Without the API it says once that the arguments could not be
// checked. When the API does not answer, the last findings stand (none at
// first: a queue is not left unconsumed for want of an HTTP answer).
func (c *Checker) Run(ctx context.Context, conn *amqp.Connection, brokerURL string) []string {
	if c.Management == nil {
		c.unchecked.Do(func() {
			c.Log.Warn("DECLARE_TOPOLOGY=false without MANAGEMENT_URL: the arguments of the topology made by others could not be checked "+
				"(a passive declare does not show them)", "hint", uncheckedHint)
		})
		c.last.Store(&Check{Status: "not checked: " + uncheckedHint})
		return nil
	}
	version, _ := conn.Properties["version"].(string)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	prev := c.last.Load()
	obs, err := c.Management.Observe(ctx, brokerURL, c.Spec, version)
	if err != nil {
		next := &Check{Status: "could not check: " + err.Error()}
		if prev != nil && len(prev.Findings) > 0 {
			next.Status += "; the last findings stand"
			next.Findings, next.NotConsumed = prev.Findings, prev.NotConsumed
		}
		if prev == nil || prev.Status != next.Status {
			c.Log.Warn("the arguments of the topology made by others could not be checked", "err", err,
				"not_consumed", next.NotConsumed)
		}
		c.last.Store(next)
		return next.NotConsumed
	}

	findings := c.Spec.Verify(obs)
	next := &Check{Status: "ok", Findings: findings}
	queues, all := Stopped(findings)
	for i := range c.Spec.Queues {
		if q := c.Spec.Queue(i); all || slices.Contains(queues, q) {
			next.NotConsumed = append(next.NotConsumed, q)
		}
	}
	if len(findings) > 0 {
		next.Status = "differs from what the service needs"
	}
	c.last.Store(next)

	var before []Finding
	if prev != nil {
		before = prev.Findings
	}
	for _, f := range findings {
		if slices.Contains(before, f) {
			continue
		}
		attrs := []any{"object", f.Object, "argument", f.Argument, "found", f.Found, "wanted", f.Wanted, "why", f.Why, "fix", f.Fix}
		if f.Severity == Refuse {
			c.Log.Error("the topology made by others would lose an account's order or dead letters: not consuming",
				append(attrs, "not_consumed", next.NotConsumed)...)
		} else {
			c.Log.Warn("the topology made by others differs from what the service needs: consuming anyway", attrs...)
		}
	}
	if len(findings) == 0 && (prev == nil || prev.Status != "ok") {
		c.Log.Info("the topology made by others has what the service needs", "broker_version", version)
	}
	return next.NotConsumed
}
