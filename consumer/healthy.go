package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"transferconsumer/event"
	"transferconsumer/retry"
)

// Between broker sessions: a queue that was blocked when its session ended
// holds the next session back until what blocked it can be reached again.
// A session (service.go) calls awaitHealthy before it dials the broker.

// awaitHealthy holds the next broker session back while a queue is still
// reported blocked from the last one and what blocked it can be probed:
// the database, when the applier can probe it, and the journal, when a
// queue waited for a read of it that could not begin (JournalReadable).
// Until the probes pass, consuming again would only take the same message
// back and, at the next consumer timeout, spend one more of its
// deliveries. It returns when they pass or stop ends; then no queue is
// blocked.
func (s *Service) awaitHealthy(stop context.Context) error {
	probes := s.probesFor(s.blocked())
	if len(probes) == 0 {
		s.clearAllBlocked()
		return nil
	}
	start := time.Now()
	waiting := "not consuming until a probe of " + probesOf(probes) + " passes: a queue was blocked when the last broker session ended"
	s.brokerErr.Store(&waiting)
	n, err := retry.Until(stop, s.cfg.Retry, func() error {
		ctx, cancel := context.WithTimeout(stop, s.cfg.ApplyTimeout)
		defer cancel()
		for _, p := range probes {
			if err := p.probe(ctx); err != nil {
				return fmt.Errorf("%s: %w", p.of, err)
			}
		}
		return nil
	}, func(attempt int, err error, delay time.Duration, logDue bool) {
		if s.cfg.ObserveRetry != nil {
			s.cfg.ObserveRetry(Retry{Attempt: attempt, Delay: delay, Err: err})
		}
		if logDue {
			s.log.Warn("a queue was blocked when the broker session ended; consuming resumes once a probe of "+probesOf(probes)+" passes",
				"attempts", attempt, "waited_ms", time.Since(start).Milliseconds(), "next_retry_ms", delay.Milliseconds(), "err", err)
		}
	})
	if err != nil {
		return err
	}
	s.clearAllBlocked()
	if n > 1 {
		s.log.Info("environment healthy again, consuming", "probe_attempts", n, "waited_ms", time.Since(start).Milliseconds())
	}
	return nil
}

// probe is one thing awaitHealthy probes: of says what.
type probe struct {
	of    string
	probe func(context.Context) error
}

// probesFor is what awaitHealthy probes for the queues blocked: the
// database if any is, and the journal if a queue waited for a read of it
// that could not begin.
func (s *Service) probesFor(blocked []Blocked) []probe {
	var out []probe
	if p, ok := s.app.(Prober); ok && len(blocked) > 0 {
		out = append(out, probe{"the database", p.Probe})
	}
	if s.cfg.JournalReadable != nil && slices.ContainsFunc(blocked, func(b Blocked) bool { return errors.Is(b.Err, event.ErrJournalUnread) }) {
		out = append(out, probe{"the journal", s.cfg.JournalReadable})
	}
	return out
}

func probesOf(ps []probe) string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.of
	}
	return strings.Join(names, " and ")
}

func (s *Service) clearAllBlocked() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.blockedQ)
}
