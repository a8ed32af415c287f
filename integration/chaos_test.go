package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The chaos run: 20,000 transfers plus about 10% duplicates over 8 queues,
// while the service's broker connections are closed from the management API,
// its database connections are terminated, and its process is restarted
// with SIGTERM and with SIGKILL. Faults are paced by progress (every so many
// applied events), not by the clock. At the end every balance is exact, the
// balances sum to zero, the inbox holds exactly the unique events, and the
// DLQ is empty.
func TestChaos(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.limit = 10
	const queues, unique, accounts = 8, 20_000, 50
	e.declare(queues)
	started := time.Now()

	// Events, with every tenth followed later by a copy of an earlier one.
	var events []transfer
	for i := 0; i < unique; i++ {
		from := fmt.Sprintf("acc_%02d_%s", rand.IntN(accounts), e.name)
		to := fmt.Sprintf("acc_%02d_%s", rand.IntN(accounts), e.name)
		for to == from {
			to = fmt.Sprintf("acc_%02d_%s", rand.IntN(accounts), e.name)
		}
		events = append(events, newTransfer(from, to, int64(1+rand.IntN(10_000))))
		if i%10 == 9 {
			events = append(events, events[rand.IntN(len(events))])
		}
	}

	var published atomic.Int64
	pubErr := make(chan error, 1)
	go func() { pubErr <- e.publishPipelined(events, &published) }()

	dbURL := e.dbURL + "&application_name=chaos-service"
	generation := 0
	start := func() *process {
		generation++
		p := startProcess(t, e.serviceEnv(queues,
			fmt.Sprintf("INSTANCE_NAME=%s-g%d", e.name, generation), "DATABASE_URL="+dbURL, "SHUTDOWN_TIMEOUT=15s"))
		p.waitConsuming(1)
		return p
	}
	proc := start()

	faults := map[string]int{}
	kinds := []string{"close broker connection", "terminate database connections", "SIGTERM restart", "SIGKILL restart"}
	// Each wait fails when the inbox stops growing for a minute (a restart
	// and its reconnects take seconds), however slowly it grows.
	const stall = time.Minute
	for step := 1; ; step++ {
		target := step * 1_500
		if target >= unique {
			break
		}
		waitProgress(t, stall, fmt.Sprintf("%d events applied", target), target, e.inboxCount)
		kind := kinds[(step-1)%len(kinds)]
		faults[kind]++
		switch kind {
		case "close broker connection":
			e.closeConnections(fmt.Sprintf("%s-g%d", e.name, generation))
		case "terminate database connections":
			var n int
			e.db.Get(&n, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE datname = current_database() AND application_name = 'chaos-service'`)
		case "SIGTERM restart":
			if err := proc.stop(syscall.SIGTERM, 30*time.Second); err != nil {
				t.Errorf("SIGTERM: exit %v, want 0", err)
			}
			proc = start()
		case "SIGKILL restart":
			proc.stop(syscall.SIGKILL, 10*time.Second)
			proc = start()
		}
	}
	if err := <-pubErr; err != nil {
		t.Fatalf("publishing: %v", err)
	}
	waitProgress(t, stall, "every unique event applied", unique, e.inboxCount)
	waitFor(t, 30*time.Second, "the queues drained", func() bool {
		for i := 0; i < queues; i++ {
			if q, ok := e.inspect(e.topology(queues).Queue(i)); !ok || q.Messages > 0 {
				return false
			}
		}
		return true
	})
	if err := proc.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("final SIGTERM: exit %v, want 0", err)
	}

	e.checkExactlyOnce(events)
	var sum, nonzero int64
	e.db.Get(&sum, `SELECT coalesce(sum(balance_minor), 0) FROM balance_projection`)
	e.db.Get(&nonzero, `SELECT count(*) FROM balance_projection WHERE balance_minor <> 0`)
	t.Logf("chaos: published %d messages (%d unique events, %d duplicates) over %d queues in %s; faults %v; "+
		"%d processes; inbox rows %d; accounts with a balance %d; balance sum %d; DLQ %d",
		published.Load(), unique, len(events)-unique, queues, time.Since(started).Round(time.Second), faults,
		generation, e.inboxCount(), nonzero, sum, len(e.peekDLQ()))
}

// publishPipelined publishes events to the hash exchange with up to 500
// confirms outstanding, counting confirmed messages in published.
func (e *env) publishPipelined(events []transfer, published *atomic.Int64) error {
	return e.publishPipelinedTo(e.amqpURL, events, published)
}

// publishPipelinedTo is publishPipelined through the broker at amqpURL: one
// node of a cluster.
func (e *env) publishPipelinedTo(amqpURL string, events []transfer, published *atomic.Int64) error {
	conn, err := amqp.DialConfig(amqpURL, amqp.Config{Properties: amqp.Table{"connection_name": e.name + "-publisher-pipelined"}})
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, len(events)))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var pending []*amqp.DeferredConfirmation
	flush := func() error {
		for _, dc := range pending {
			if ok, err := dc.WaitContext(ctx); err != nil || !ok {
				return fmt.Errorf("publish not confirmed: %v", err)
			}
			published.Add(1)
		}
		pending = pending[:0]
		select {
		case r := <-returns:
			return fmt.Errorf("unroutable: %s", r.ReplyText)
		default:
			return nil
		}
	}
	for _, ev := range events {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, prefix, ev.Data.FromAccount, true, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, ContentType: "application/json", MessageId: ev.EventID,
			Type: ev.EventType, Body: ev.body(),
		})
		if err != nil {
			return err
		}
		if pending = append(pending, dc); len(pending) == 500 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}
