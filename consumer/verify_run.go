package consumer

import (
	"context"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TopologyCheck is what the last check of a topology made by others found.
type TopologyCheck struct {
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

// verify checks the topology made by others through the management API,
// logs what differs from what the service needs when that changed since the
// last check, records it for State, and returns the partition queues not
// to consume. Without the API it says once that the arguments could not be
// checked. When the API does not answer, the last findings stand (none at
// first: a queue is not left unconsumed for want of an HTTP answer).
func (s *Service) verify(ctx context.Context, conn *amqp.Connection, brokerURL string) []string {
	if s.cfg.Management == nil {
		s.unchecked.Do(func() {
			s.log.Warn("DECLARE_TOPOLOGY=false without MANAGEMENT_URL: the arguments of the topology made by others could not be checked "+
				"(a passive declare does not show them)", "hint", uncheckedHint)
		})
		s.check.Store(&TopologyCheck{Status: "not checked: " + uncheckedHint})
		return nil
	}
	version, _ := conn.Properties["version"].(string)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	prev := s.check.Load()
	obs, err := s.cfg.Management.Observe(ctx, brokerURL, s.cfg.Topology, version)
	if err != nil {
		next := &TopologyCheck{Status: "could not check: " + err.Error()}
		if prev != nil && len(prev.Findings) > 0 {
			next.Status += "; the last findings stand"
			next.Findings, next.NotConsumed = prev.Findings, prev.NotConsumed
		}
		if prev == nil || prev.Status != next.Status {
			s.log.Warn("the arguments of the topology made by others could not be checked", "err", err,
				"not_consumed", next.NotConsumed)
		}
		s.check.Store(next)
		return next.NotConsumed
	}

	findings := s.cfg.Topology.Verify(obs)
	next := &TopologyCheck{Status: "ok", Findings: findings}
	queues, all := Stopped(findings)
	for i := range s.cfg.Topology.Queues {
		if q := s.cfg.Topology.Queue(i); all || slices.Contains(queues, q) {
			next.NotConsumed = append(next.NotConsumed, q)
		}
	}
	if len(findings) > 0 {
		next.Status = "differs from what the service needs"
	}
	s.check.Store(next)

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
			s.log.Error("the topology made by others would lose an account's order or dead letters: not consuming",
				append(attrs, "not_consumed", next.NotConsumed)...)
		} else {
			s.log.Warn("the topology made by others differs from what the service needs: consuming anyway", attrs...)
		}
	}
	if len(findings) == 0 && (prev == nil || prev.Status != "ok") {
		s.log.Info("the topology made by others has what the service needs", "broker_version", version)
	}
	return next.NotConsumed
}
