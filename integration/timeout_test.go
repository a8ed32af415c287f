package integration

import (
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/retry"
)

// The broker's consumer timeout (30 minutes by default) closes a channel
// whose delivery stays unacknowledged longer. During a database outage
// longer than that, the message in hand goes back to its queue once, one
// delivery spent; the service then consumes nothing until a probe of the
// database passes, so however long the outage lasts, no more deliveries are
// spent and nothing is dead-lettered (adr/0002). Here the timeout is 3 s,
// the outage more than three times that, and the delivery limit 1.
func TestOutageLongerThanTheConsumerTimeoutSpendsOneDelivery(t *testing.T) {
	e := newEnv(t)
	e.limit = 1
	ctl := rabbitmqctl(t)
	const timeout = 3 * time.Second
	setConsumerTimeout(t, ctl, timeout)

	u, _ := url.Parse(e.dbURL)
	p := newProxy(t, u.Host)
	u.Host = p.addr
	proxied, err := db.Open(t.Context(), u.String(), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer proxied.Close()
	var mu sync.Mutex
	var firstRetry, lastRetry time.Time // in place, or probes before consuming again
	svc := e.startWith(2, db.NewInbox(proxied), func(c *consumer.Config) {
		c.Retry = retry.Backoff{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond}
		observe := c.ObserveRetry
		c.ObserveRetry = func(r consumer.Retry) {
			observe(r)
			mu.Lock()
			defer mu.Unlock()
			if firstRetry.IsZero() {
				firstRetry = time.Now()
			}
			lastRetry = time.Now()
		}
	})

	p.down()
	events := e.publishMany(8, 4)
	waitFor(t, 120*time.Second, "retries spanning three consumer timeouts", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !firstRetry.IsZero() && lastRetry.Sub(firstRetry) > 3*timeout
	})
	// While it probes, the service holds no message: all are in the queues.
	top := e.topology(2)
	if held := len(events) - e.ready(top.Queue(0)) - e.ready(top.Queue(1)); held != 0 {
		t.Errorf("%d messages held while the database is away after a consumer timeout, want 0", held)
	}

	p.up()
	waitFor(t, 60*time.Second, "every event applied and acked", func() bool {
		for _, ev := range events {
			ds := svc.rec.of(ev.EventID)
			if len(ds) == 0 || ds[len(ds)-1].Action != consumer.ActionAck {
				return false
			}
		}
		return true
	})
	spent := 0
	for _, ev := range events {
		ds := svc.rec.of(ev.EventID)
		last := ds[len(ds)-1]
		if last.Action != consumer.ActionAck || last.Duplicate || last.DeliveryCount > 1 {
			t.Errorf("event %s: want applied, at most one delivery spent, got %+v", ev.EventID, ds)
		}
		for _, d := range ds[:len(ds)-1] { // the message in hand when the broker session ended
			if d.Action != consumer.ActionRequeue {
				t.Errorf("event %s: want only a return to the queue before it was applied, got %+v", ev.EventID, d)
			}
		}
		spent += int(last.DeliveryCount)
	}
	// Up to 4.2 the timeout closes the channel, and the returns count: one
	// per message in hand at the timeout, one per queue with prefetch 1, up
	// to BATCH_MAX per queue with batches; never more than one each. From
	// 4.3 the queue cancels the consumer and returns what it held uncounted,
	// so a queue whose consumer timed out spends none (only one whose
	// channel the session's end closed while it held a message spends one).
	least := 1
	if v := brokerVersion(t, e.b); !strings.HasPrefix(v, "3.") && !strings.HasPrefix(v, "4.0.") &&
		!strings.HasPrefix(v, "4.1.") && !strings.HasPrefix(v, "4.2.") {
		least = 0
	}
	if most := min(len(events), 2*batchMax()); spent < least || spent > most {
		t.Errorf("%d deliveries spent in all, want one per message in hand at the timeout (%d to %d)", spent, least, most)
	}
	t.Logf("outage of more than %s with a consumer timeout of %s: %d deliveries spent, none dead-lettered", 3*timeout, timeout, spent)
	e.checkExactlyOnce(events)
}

// setConsumerTimeout sets the broker's consumer timeout for channels opened
// from now on, and how often a channel checks it (every minute by default),
// and puts the old values back when the test ends.
func setConsumerTimeout(t *testing.T, ctl brokerCtl, d time.Duration) {
	t.Helper()
	setBrokerEnv(t, ctl, "consumer_timeout", d.Milliseconds())
	setBrokerEnv(t, ctl, "channel_tick_interval", d.Milliseconds()/4)
}

// setBrokerEnv sets one of the broker's application settings and returns a
// function that puts the old value back (or unsets it); the test's end
// calls it too.
func setBrokerEnv(t *testing.T, ctl brokerCtl, key string, value int64) (restore func()) {
	t.Helper()
	alone(t, "the broker's "+key)
	previous := strings.TrimSpace(ctl.run(t, "eval", fmt.Sprintf("application:get_env(rabbit, %s).", key)))
	v, set := strings.CutPrefix(previous, "{ok,")
	if !set && previous != "undefined" {
		// Unsetting a setting the broker's own defaults fill (a channel
		// reads channel_tick_interval as it opens) would break every
		// channel opened after: touch nothing.
		t.Fatalf("the broker's %s reads as %q, neither {ok, …} nor undefined: not changed", key, previous)
	}
	var once sync.Once
	restore = func() {
		once.Do(func() {
			if set {
				ctl.run(t, "eval", fmt.Sprintf("application:set_env(rabbit, %s, %s).", key, strings.TrimSuffix(v, "}")))
			} else {
				ctl.run(t, "eval", fmt.Sprintf("application:unset_env(rabbit, %s).", key))
			}
		})
	}
	t.Cleanup(restore)
	ctl.run(t, "eval", fmt.Sprintf("application:set_env(rabbit, %s, %d).", key, value))
	return restore
}
