package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
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
		depth, extra, err = s.lookThroughManagement(ctx, brokerURL)
	} else {
		depth, extra, err = s.lookOverAMQP(conn, first)
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

// lookOverAMQP reads the DLQ's depth with a passive declare, and, when
// beyond is set, the partition queues from QUEUE_COUNT up, until one is
// missing (which closes the channel: the broker logs it once).
func (s *Service) lookOverAMQP(conn *amqp.Connection, beyond bool) (int64, []string, error) {
	ch, err := conn.Channel()
	if err != nil {
		return -1, nil, err
	}
	defer ch.Close()
	t := s.cfg.Topology
	q, err := ch.QueueDeclarePassive(dlq.Queue(t.Prefix), true, false, false, false, nil)
	if err != nil {
		return -1, nil, err // the channel is closed now
	}
	var extra []string
	for i := t.Queues; beyond && i < maxQueues; i++ {
		if _, err := ch.QueueDeclarePassive(t.Queue(i), true, false, false, false, nil); err != nil {
			break
		}
		extra = append(extra, t.Queue(i))
	}
	return int64(q.Messages), extra, nil
}

// lookThroughManagement reads the same through the management API: one
// GET for the DLQ, and one for each queue from QUEUE_COUNT up until one
// does not exist. The depth is -1 when the API has no figure yet (its
// statistics lag a queue's declaration by a few seconds).
func (s *Service) lookThroughManagement(ctx context.Context, brokerURL string) (int64, []string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m := s.cfg.Management
	api, user, password, vhost, err := m.target(brokerURL)
	if err != nil {
		return -1, nil, err
	}
	queue := func(name string) ([]byte, error) {
		return m.get(ctx, api, user, password, "/api/queues/"+vhost+"/"+url.PathEscape(name))
	}
	t := s.cfg.Topology
	body, err := queue(dlq.Queue(t.Prefix))
	if err != nil {
		return -1, nil, err
	}
	depth := int64(-1)
	var q struct {
		Messages *int64 `json:"messages"`
	}
	if body != nil && json.Unmarshal(body, &q) == nil && q.Messages != nil {
		depth = *q.Messages
	}
	var extra []string
	for i := t.Queues; i < maxQueues; i++ {
		body, err := queue(t.Queue(i))
		if err != nil {
			return -1, nil, err
		}
		if body == nil {
			break
		}
		extra = append(extra, t.Queue(i))
	}
	return depth, extra, nil
}

// target returns what a request needs for the vhost of brokerURL: the
// API's base URL, its credentials (the API URL's, else the broker URL's)
// and the vhost, path-escaped.
func (m *Management) target(brokerURL string) (api *url.URL, user, password, vhost string, err error) {
	uri, err := amqp.ParseURI(brokerURL)
	if err != nil {
		return nil, "", "", "", errors.New("the broker URL does not parse")
	}
	api = m.URL
	if m.URLFunc != nil {
		if api, err = m.URLFunc(); err != nil {
			return nil, "", "", "", fmt.Errorf("management API: %w", err)
		}
	}
	user, password = uri.Username, uri.Password
	if api.User != nil {
		user = api.User.Username()
		password, _ = api.User.Password()
	}
	return api, user, password, url.PathEscape(uri.Vhost), nil
}
