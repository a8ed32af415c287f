package consumer

import (
	"context"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// lookInterval is Config.LookEvery, or lookEvery when it is not set.
func (s *Service) lookInterval() time.Duration {
	if s.cfg.LookEvery > 0 {
		return s.cfg.LookEvery
	}
	return lookEvery
}

// look reads the dead-letter queue's depth and which partition queues
// numbered QUEUE_COUNT and up exist. Queues found there hold messages this
// instance never takes, such as after a repartition that this instance was
// not rolled for: it says so once per change, as a warning.
//
// It makes the broker log no error. With the management API (Management)
// it asks the API for each queue, where a missing one is a 404 and nothing
// more. Without it, it must ask over AMQP, where a passive declare of a
// missing queue closes the channel and the broker logs that as a channel
// error ("not_found"), which the estate's broker admins watch: so it looks
// beyond QUEUE_COUNT only once per session (first), at connect, and
// between connects reads only the DLQ's depth, which exists.
func (s *Service) look(ctx context.Context, conn *amqp.Connection, brokerURL string, first bool) {
	var (
		depth int64
		extra []string
		err   error
	)
	if s.cfg.Management != nil {
		depth, extra, err = s.cfg.Management.Look(ctx, brokerURL, s.cfg.Topology)
	} else {
		depth, extra, err = s.cfg.Topology.LookOverAMQP(conn, first)
		if !first && err == nil {
			extra = nil
			if before := s.extra.Load(); before != nil {
				extra = *before // as seen at connect
			}
		}
	}
	if err != nil {
		return // the depth and the queues stay as last seen
	}
	if depth >= 0 {
		s.dlqDepth.Store(depth)
	}
	t := s.cfg.Topology
	if before := s.extra.Swap(&extra); before == nil || !slices.Equal(*before, extra) {
		if len(extra) > 0 {
			s.log.Warn("partition queues exist beyond QUEUE_COUNT: their messages are not consumed by this instance",
				"queues", extra, "queue_count", t.Queues,
				"hint", "set QUEUE_COUNT to the number of queues bound to the exchange (see adr/0004 on repartitioning)")
		} else if before != nil && len(*before) > 0 {
			s.log.Info("no partition queues beyond QUEUE_COUNT any more")
		}
	}
}
