package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A steady load (-steady RATE) measures latency instead of a drain: the
// subject starts with empty queues, then the harness publishes the backlog's
// events at RATE per second, each with the time it was sent, and the
// latency of an event runs from that time to its inbox row's processed_at
// (the start of the transaction that applied it). At a light load a batch
// is one event, and the latency with batches should be no worse.

type steadyLoad struct {
	mu   sync.Mutex
	sent map[string]time.Time // event id → when it was published
	err  error
	done chan struct{}
}

// startSteady publishes the backlog at h.steadyRate events/s in the
// background, each confirmed, spread over the accounts (and so the queues).
func (h *harness) startSteady(vhostURL string) *steadyLoad {
	l := &steadyLoad{sent: map[string]time.Time{}, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		l.err = h.publishSteady(vhostURL, l)
	}()
	return l
}

func (h *harness) publishSteady(vhostURL string, l *steadyLoad) error {
	conn, ch, err := confirmChannel(vhostURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	tick := time.NewTicker(time.Second / time.Duration(h.steadyRate))
	defer tick.Stop()
	ctx := context.Background()
	for i, b := range h.bodies {
		<-tick.C
		var ev struct {
			EventID string `json:"eventId"`
		}
		_ = json.Unmarshal(b, &ev)
		l.mu.Lock()
		l.sent[ev.EventID] = time.Now()
		l.mu.Unlock()
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "transfers", h.keys[i], false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: b, UserId: h.userID,
		})
		if err != nil {
			return err
		}
		go dc.WaitContext(ctx) // confirms are awaited, not waited on in turn
	}
	return nil
}

// latency returns the p50 and p99 of the events' latencies, once the
// publisher is done.
func (l *steadyLoad) latency(db *sql.DB) (summary, error) {
	<-l.done
	if l.err != nil {
		return summary{}, fmt.Errorf("steady publisher: %w", l.err)
	}
	rows, err := db.Query(`SELECT event_id::text, processed_at FROM processed_event`)
	if err != nil {
		return summary{}, err
	}
	defer rows.Close()
	var ms []float64
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			return summary{}, err
		}
		if sent, ok := l.sent[id]; ok {
			ms = append(ms, float64(at.Sub(sent).Microseconds())/1000)
		}
	}
	if len(ms) == 0 {
		return summary{}, fmt.Errorf("no latency measured")
	}
	sort.Float64s(ms)
	return summary{P50ms: ms[len(ms)/2], P99ms: ms[len(ms)*99/100]}, rows.Err()
}

// waitConsumers waits until each of the queues has a consumer, or the
// subject exits.
func waitConsumers(vhostURL string, queues int, exited <-chan error) error {
	conn, err := amqp.Dial(vhostURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	deadline := time.Now().Add(time.Minute)
	for i := 0; i < queues; {
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		q, err := ch.QueueDeclarePassive(fmt.Sprintf("transfers.%d", i), true, false, false, false, nil)
		ch.Close()
		if err == nil && q.Consumers > 0 {
			i++
			continue
		}
		select {
		case err := <-exited:
			return fmt.Errorf("exited before consuming: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("queue transfers.%d has no consumer after a minute", i)
		}
	}
	return nil
}
