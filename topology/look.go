package topology

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
)

// A service that consumes QUEUE_COUNT queues looks, every few seconds, at
// the DLQ's depth and for partition queues beyond its count (left by a
// repartition it was not rolled for): these read it, over AMQP or, without
// a channel error in the broker's log, through the management API.

// maxQueues bounds the look for queues beyond QUEUE_COUNT (the largest
// count the configuration accepts).
const maxQueues = 1024

// LookOverAMQP returns the DLQ's depth, read with a passive declare, and,
// when beyond is set, the partition queues from t.Queues up that exist,
// until one is missing (which closes the channel: the broker logs it once).
func (t Spec) LookOverAMQP(conn *amqp.Connection, beyond bool) (int64, []string, error) {
	ch, err := conn.Channel()
	if err != nil {
		return -1, nil, err
	}
	defer ch.Close()
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

// Look returns what LookOverAMQP does, read through the management API in
// the vhost of brokerURL: one GET for the DLQ, and one for each queue from
// t.Queues up until one does not exist, so the broker logs no error for a
// queue that is missing. The depth is -1 when the API has no figure yet
// (its statistics lag a queue's declaration by a few seconds).
func (m *Management) Look(ctx context.Context, brokerURL string, t Spec) (int64, []string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	api, user, password, vhost, err := m.target(brokerURL)
	if err != nil {
		return -1, nil, err
	}
	queue := func(name string) ([]byte, error) {
		return m.get(ctx, api, user, password, "/api/queues/"+vhost+"/"+url.PathEscape(name))
	}
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

// QueueCount is the broker's own count of a queue's messages: all of them,
// those ready to be delivered, and those delivered and not yet
// acknowledged (held by a consumer or by a reader's basic.get). It comes
// from the management API's statistics, which the broker refreshes every
// collect_statistics_interval (5 s by default): a count can be that old.
type QueueCount struct {
	Messages, Ready, Unacked int64
}

// Count returns the broker's count of queue in the vhost of brokerURL; ok
// is false when the queue does not exist or the API has no figure for it
// yet.
func (m *Management) Count(ctx context.Context, brokerURL, queue string) (c QueueCount, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	api, user, password, vhost, err := m.target(brokerURL)
	if err != nil {
		return c, false, err
	}
	body, err := m.get(ctx, api, user, password, "/api/queues/"+vhost+"/"+url.PathEscape(queue))
	if err != nil || body == nil {
		return c, false, err
	}
	var q struct {
		Messages *int64 `json:"messages"`
		Ready    *int64 `json:"messages_ready"`
		Unacked  *int64 `json:"messages_unacknowledged"`
	}
	if err := json.Unmarshal(body, &q); err != nil {
		return c, false, fmt.Errorf("management API: queue %s: %w", queue, err)
	}
	if q.Messages == nil || q.Ready == nil || q.Unacked == nil {
		return c, false, nil
	}
	return QueueCount{Messages: *q.Messages, Ready: *q.Ready, Unacked: *q.Unacked}, true, nil
}
