package integration

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/dlq"
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

// A queue whose lane must read the journal before its next event (the
// database cannot vouch for the queue's mark: here its row is written
// again, as a restore writes it) while the journal cannot be
// read (the service may not consume the stream) holds its event until the
// broker's consumer timeout returns it, one delivery spent at most; the
// service then consumes nothing until a probe of the journal passes,
// however long that takes, so no more deliveries are spent and nothing is
// dead-lettered: an unreadable journal is the environment's fault, as a
// database outage is (TestOutageLongerThanTheConsumerTimeoutSpendsOneDelivery).
// The timeout is 3 s, the journal unreadable more than three times that,
// and the delivery limit 1.
func TestAnUnreadableJournalLongerThanTheConsumerTimeoutSpendsOneDelivery(t *testing.T) {
	e := newEnv(t)
	e.limit = 1
	ctl := rabbitmqctl(t)
	const timeout = 3 * time.Second
	stream := prefix + ".journal"
	env := e.serviceEnv(1, "INSTANCE_NAME="+e.name+"-svc", "JOURNAL_STREAM="+stream)
	proc := startProcess(t, env)
	proc.waitConsuming(1)
	first := e.publishMany(3, 2)
	waitFor(t, 30*time.Second, "the first events applied", func() bool { return proc.count("outcome", "applied") == len(first) })
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}

	// The database no longer vouches for the mark, so the lane reads the
	// journal before it goes on: its row written again by another
	// transaction than the one it names, as a data-only restore writes it
	// (a restart, a failover or any other restore does the same; this
	// test shares its server with the others).
	res, err := e.db.Exec(`UPDATE journal_mark SET seq = seq`)
	if n, _ := res.RowsAffected(); err != nil || n != 1 {
		t.Fatalf("the queue's mark made unvouched: %d rows (%v), want 1", n, err)
	}
	perms := "/api/permissions/" + url.PathEscape(e.vhost) + "/" + url.PathEscape(e.b.adminUser())
	readOnly := func(read string) {
		e.b.mgmt(t, http.MethodPut, perms, map[string]string{"configure": ".*", "write": ".*", "read": read}, nil)
	}
	readOnly(`^(?!` + regexp.QuoteMeta(stream) + `$).*`) // every queue but the stream
	setConsumerTimeout(t, ctl, timeout)

	events := e.publishMany(4, 2)
	proc = startProcess(t, env)
	const probing = "a queue was blocked when the broker session ended; consuming resumes once a probe of "
	// Three consumer timeouts of probing; or three broker sessions ended,
	// when the service consumes again without waiting for the journal.
	waitFor(t, 120*time.Second, "probes of the journal spanning three consumer timeouts", func() bool {
		return proc.most(probing, "waited_ms") > float64((3*timeout).Milliseconds()) ||
			proc.count("msg", "broker session ended, reconnecting") >= 3
	})
	if n := e.ready(dlq.Queue(prefix)); n != 0 {
		t.Errorf("%d events dead-lettered by the queue's delivery limit while the journal could not be read, want none", n)
	}
	if probes := proc.lineSaying(probing); !strings.Contains(probes, "the journal") {
		t.Errorf("the service probes %q; want the journal probed", probes)
	}
	if n := proc.count("outcome", "applied"); n != 0 {
		t.Fatalf("%d events applied while the journal could not be read and the mark was not vouched for, want none", n)
	}
	// While it probes, the service holds no message: all are in the queue.
	if held := len(events) - e.ready(e.topology(1).Queue(0)); held != 0 {
		t.Errorf("%d messages held while the journal cannot be read, after a consumer timeout; want 0", held)
	}

	readOnly(".*")
	waitFor(t, 60*time.Second, "every event applied once the journal can be read", func() bool {
		return proc.count("outcome", "applied") == len(events)
	})
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	if n := proc.count("outcome", "dead_lettered"); n != 0 {
		t.Errorf("%d events dead-lettered, want none", n)
	}
	spent := 0
	for _, line := range proc.linesWith("outcome", "applied") {
		c, _ := line["delivery_count"].(float64)
		if c > 1 {
			t.Errorf("event %v applied at delivery count %v, want at most one delivery spent", line["event_id"], c)
		}
		spent += int(c)
	}
	t.Logf("the journal unreadable for more than %s with a consumer timeout of %s: %d deliveries spent, none dead-lettered", 3*timeout, timeout, spent)
	e.checkExactlyOnce(append(first, events...))
	journaled := e.journaled([]string{e.amqpURL}, stream)
	for _, tr := range append(first, events...) {
		if !journaled[tr.EventID] {
			t.Errorf("event %s acked, not in the journal", tr.EventID)
		}
	}
}

// most returns the largest number under key in the log lines whose msg
// begins with prefix; 0 when none.
func (p *process) most(prefix, key string) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n float64
	for _, l := range p.lines {
		if msg, _ := l["msg"].(string); strings.HasPrefix(msg, prefix) {
			if v, ok := l[key].(float64); ok && v > n {
				n = v
			}
		}
	}
	return n
}

// lineSaying returns the msg of the last log line whose msg begins with
// prefix.
func (p *process) lineSaying(prefix string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.lines) - 1; i >= 0; i-- {
		if msg, _ := p.lines[i]["msg"].(string); strings.HasPrefix(msg, prefix) {
			return msg
		}
	}
	return ""
}

// linesWith returns the log lines whose key is value.
func (p *process) linesWith(key, value string) []map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []map[string]any
	for _, l := range p.lines {
		if l[key] == value {
			out = append(out, l)
		}
	}
	return out
}
