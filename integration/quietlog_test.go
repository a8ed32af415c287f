package integration

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/consumer"
)

// The service's look at the broker every few seconds (the DLQ's depth, and
// partition queues beyond QUEUE_COUNT) leaves no channel error in the
// broker's log, which the estate's broker admins watch: through the
// management API none at all; over AMQP alone one, at connect, when it
// looks past the last queue. The count is read from the broker's own log
// file, after a sentinel error the test causes itself has reached it.
func TestTheServicesLookLeavesNoChannelErrorsInTheBrokersLog(t *testing.T) {
	parallel(t)
	ctl := rabbitmqctl(t)
	e := newEnv(t)
	const queues = 2
	servicePattern := fmt.Sprintf(`not_found: no queue '%s\\.[0-9]+' in vhost '%s'`, prefix, e.vhost)
	e.declare(queues) // so that the harness's own look for consumers finds the queues

	// Through the management API: many looks, counted at the API.
	var gets atomic.Int64
	svc := e.startWith(queues, nil, func(c *consumer.Config) {
		c.LookEvery = 50 * time.Millisecond
		c.Management.Client = &http.Client{Timeout: 10 * time.Second, Transport: countingTransport{&gets}}
	})
	waitFor(t, 30*time.Second, "ten looks through the management API", func() bool { return gets.Load() >= 20 })
	svc.stop()

	// Over AMQP alone: the look past the last queue at connect, then the
	// DLQ's depth only, seen to follow two letters put there by hand.
	svc = e.startWith(queues, nil, func(c *consumer.Config) {
		c.LookEvery = 50 * time.Millisecond
		c.Management = nil
	})
	for n := 1; n <= 2; n++ {
		e.publishTo("", prefix+".dlq", []byte(`{"letter":`+strconv.Itoa(n)+`}`), "", nil)
		waitFor(t, 30*time.Second, fmt.Sprintf("a look that sees %d letters", n), func() bool { return svc.svc.State().DLQDepth == n })
	}
	svc.stop()

	// The sentinel: a not_found of the test's own, logged after all of the
	// services' lines.
	sentinel := "sentinel_" + randomSuffix()
	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclarePassive(sentinel, true, false, false, false, nil); err == nil {
		t.Fatal("the sentinel queue exists")
	}
	waitFor(t, 30*time.Second, "the sentinel in the broker's log", func() bool {
		return brokerLogCount(t, ctl, fmt.Sprintf(`not_found: no queue '%s' in vhost '%s'`, sentinel, e.vhost)) == 1
	})
	if n := brokerLogCount(t, ctl, servicePattern); n != 1 {
		t.Errorf("the broker logged %d not_found errors for the services' looks, want 1 (the AMQP look at connect; none through the management API)", n)
	}
}

// countingTransport counts the requests it passes on.
type countingTransport struct{ n *atomic.Int64 }

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return http.DefaultTransport.RoundTrip(r)
}

// brokerLogCount counts the matches of the regular expression pattern (no
// double quotes in it) in the log file of the broker under test, read by
// the broker itself: a node in a chroot has its log where only it knows.
func brokerLogCount(t *testing.T, ctl brokerCtl, pattern string) int {
	t.Helper()
	out := ctl.run(t, "eval", `{ok, B} = file:read_file(hd(rabbit:log_locations())),
		case re:run(B, "`+pattern+`", [global]) of {match, M} -> length(M); nomatch -> 0 end.`)
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("count in the broker's log: %q: %v", out, err)
	}
	return n
}
