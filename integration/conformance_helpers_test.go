package integration

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
	"transferconsumer/topology"
)

// What the TestBrokerRule tests share: a vhost of their own with one
// partition queue declared as the service declares it, and small clients
// that record what the broker does.

// patience bounds every wait for something the test itself caused. It is
// generous: no test depends on the machine's speed, only on the broker
// eventually doing what was asked.
const patience = 30 * time.Second

// rig is one rule test's world: its vhost, the queue and dead-letter queue
// in it, and the version of the broker they live on.
type rig struct {
	t       *testing.T
	vhost   string
	url     string // AMQP URL with the vhost
	version string // connection.Properties["version"]
	ver     [3]int
	queue   string
	dlq     string
	limit   int
	pub     *amqp.Channel // confirm mode, default exchange
}

const rulePrefix = "transfers"

// newRig makes a vhost for the test (removed when it ends) and declares in
// it, as the service does, the dead-letter pair and one partition queue
// with a delivery limit of 5.
func newRig(t *testing.T) *rig {
	t.Helper()
	if unavailable != "" {
		t.Skip(unavailable)
	}
	name := strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "_"))
	if len(name) > 50 {
		name = name[:50]
	}
	r := &rig{t: t, vhost: "tc_" + name + "_" + randomSuffix(), limit: 5}
	shared.mgmt(t, http.MethodPut, "/api/vhosts/"+url.PathEscape(r.vhost), nil, nil)
	t.Cleanup(func() { shared.mgmtQuiet(http.MethodDelete, "/api/vhosts/"+url.PathEscape(r.vhost)) })
	shared.mgmt(t, http.MethodPut, "/api/permissions/"+url.PathEscape(r.vhost)+"/"+url.PathEscape(shared.adminUser()),
		map[string]string{"configure": ".*", "write": ".*", "read": ".*"}, nil)
	u, err := url.Parse(shared.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + r.vhost
	u.RawPath = "/" + url.PathEscape(r.vhost)
	r.url = u.String()

	conn := r.dial("setup")
	r.version, _ = conn.Properties["version"].(string)
	for i, p := range strings.SplitN(r.version, ".", 3) {
		r.ver[i], _ = strconv.Atoi(strings.TrimFunc(p, func(c rune) bool { return c < '0' || c > '9' }))
	}
	t.Logf("RabbitMQ %s", r.version)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := dlq.Declare(ch, rulePrefix, r.version); err != nil {
		t.Fatal(err)
	}
	r.dlq = dlq.Queue(rulePrefix)
	top := topology.Spec{Prefix: rulePrefix, Queues: 1, DeliveryLimit: r.limit}
	r.queue = top.Queue(0)
	if _, err := ch.QueueDeclare(r.queue, true, false, false, false, top.QueueArgs()); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	r.pub = ch
	return r
}

// atLeast reports whether the broker's version is major.minor or later.
func (r *rig) atLeast(major, minor int) bool {
	return r.ver[0] > major || r.ver[0] == major && r.ver[1] >= minor
}

// dial opens a connection named after the test and role, closed at the end.
func (r *rig) dial(role string) *amqp.Connection {
	r.t.Helper()
	conn, err := amqp.DialConfig(r.url, amqp.Config{Properties: amqp.Table{"connection_name": r.vhost + "-" + role}})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { conn.Close() })
	return conn
}

// publish publishes persistent messages with these bodies (also their
// message ids) to the queue and waits for the broker's confirms.
func (r *rig) publish(bodies ...string) {
	r.t.Helper()
	for _, b := range bodies {
		c, err := r.pub.PublishWithDeferredConfirm("", r.queue, true, false,
			amqp.Publishing{Body: []byte(b), MessageId: b, DeliveryMode: amqp.Persistent})
		if err != nil {
			r.t.Fatal(err)
		}
		if !c.Wait() {
			r.t.Fatalf("broker refused %s", b)
		}
	}
}

// ready returns the queue's ready messages as the queue's leader counts
// them (a passive declare, not the management API's lagging statistics).
func (r *rig) ready() int {
	r.t.Helper()
	q, err := r.pub.QueueDeclarePassive(r.queue, true, false, false, false, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	return q.Messages
}

// sub is one consumer on its own channel, with the broker's cancel and
// close notifications registered (and buffered, so they never block the
// connection).
type sub struct {
	t       *testing.T
	conn    *amqp.Connection
	ch      *amqp.Channel
	tag     string
	d       <-chan amqp.Delivery
	cancels chan string
	closes  chan *amqp.Error
}

// consume opens a channel on conn with prefetch and starts consumer tag on
// the rig's queue.
func (r *rig) consume(conn *amqp.Connection, tag string, prefetch int) *sub {
	r.t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		r.t.Fatal(err)
	}
	s := &sub{t: r.t, conn: conn, ch: ch, cancels: make(chan string, 4), closes: make(chan *amqp.Error, 1)}
	ch.NotifyCancel(s.cancels)
	ch.NotifyClose(s.closes)
	if err := ch.Qos(prefetch, 0, false); err != nil {
		r.t.Fatal(err)
	}
	s.start(r.queue, tag)
	return s
}

// start adds consumer tag on the sub's channel (a second consumer on the
// same channel replaces d).
func (s *sub) start(queue, tag string) {
	s.t.Helper()
	d, err := s.ch.Consume(queue, tag, false, false, false, false, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	s.tag, s.d = tag, d
}

// next waits for the sub's next delivery.
func (s *sub) next() amqp.Delivery {
	s.t.Helper()
	select {
	case d, ok := <-s.d:
		if !ok {
			s.t.Fatalf("consumer %s: deliveries closed before the next one came", s.tag)
		}
		return d
	case <-time.After(patience):
		s.t.Fatalf("consumer %s: no delivery within %s", s.tag, patience)
	}
	return amqp.Delivery{}
}

// take receives n deliveries, acknowledging each before the next, and
// returns their bodies in the order they came.
func (s *sub) take(n int) []string {
	s.t.Helper()
	var out []string
	for range n {
		d := s.next()
		out = append(out, string(d.Body))
		if err := d.Ack(false); err != nil {
			s.t.Fatal(err)
		}
	}
	return out
}

// deadLetters consumes the dead-letter queue on conn.
func (r *rig) deadLetters(conn *amqp.Connection) <-chan amqp.Delivery {
	r.t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		r.t.Fatal(err)
	}
	d, err := ch.Consume(r.dlq, "dlq", true, false, false, false, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	return d
}

// header returns an integer header as an int64, and whether it is there.
func header(h amqp.Table, name string) (int64, bool) {
	switch v := h[name].(type) {
	case int64:
		return v, true
	case int32:
		return int64(v), true
	case int16:
		return int64(v), true
	case int8:
		return int64(v), true
	case int:
		return int64(v), true
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint32:
		return int64(v), true
	}
	return 0, false
}

// counts renders a delivery's x-delivery-count and x-acquired-count ("-"
// when absent).
func counts(h amqp.Table) string {
	show := func(name string) string {
		if v, ok := header(h, name); ok {
			return strconv.FormatInt(v, 10)
		}
		return "-"
	}
	return fmt.Sprintf("dc=%s ac=%s", show("x-delivery-count"), show("x-acquired-count"))
}

// death returns the first x-death entry's reason and count, and
// x-first-death-reason.
func death(h amqp.Table) (reason string, count int64, first string) {
	first, _ = h["x-first-death-reason"].(string)
	deaths, _ := h["x-death"].([]any)
	if len(deaths) == 0 {
		return "", 0, first
	}
	d, _ := deaths[0].(amqp.Table)
	reason, _ = d["reason"].(string)
	count, _ = header(d, "count")
	return reason, count, first
}

// ctlFor returns rabbitmqctl for the broker under test, and false when
// there is none: TEST_RABBITMQCTL, else a local rabbitmqctl, and only when
// the node it reaches runs the version under test (a host's rabbitmqctl
// must not change a 3.10 node while the tests run on a 4.x one).
func (r *rig) ctlFor() (brokerCtl, bool) {
	var ctl brokerCtl
	if v := os.Getenv("TEST_RABBITMQCTL"); v != "" {
		ctl = brokerCtl(strings.Fields(v))
	} else if path, err := exec.LookPath("rabbitmqctl"); err == nil {
		ctl = brokerCtl{path}
	} else {
		return nil, false
	}
	out, err := exec.Command(ctl[0], append(ctl[1:len(ctl):len(ctl)], "eval", "rabbit_misc:version().")...).CombinedOutput()
	if err != nil || strings.Trim(strings.TrimSpace(string(out)), `"`) != r.version {
		return nil, false
	}
	return ctl, true
}

// setPolicy sets a policy on the rig's declared queue, in the test's own
// vhost (it goes with the vhost), and waits until the queue carries it.
func (r *rig) setPolicy(definition map[string]any) {
	r.t.Helper()
	shared.mgmt(r.t, http.MethodPut, "/api/policies/"+url.PathEscape(r.vhost)+"/rule", map[string]any{
		"pattern": "^" + regexp.QuoteMeta(r.queue) + "$", "apply-to": "queues", "priority": 10, "definition": definition,
	}, nil)
	waitFor(r.t, patience, "the policy on "+r.queue, func() bool {
		var q struct {
			Policy string `json:"policy"`
		}
		err := shared.mgmtErr(http.MethodGet, "/api/queues/"+url.PathEscape(r.vhost)+"/"+url.PathEscape(r.queue), nil, &q)
		return err == nil && q.Policy == "rule"
	})
}

// must fails the test on an error from a call that should not fail.
func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// killConnection closes, through the management API, the rig's connection
// of that role, as an operator or a network fault would.
func (r *rig) killConnection(role string) {
	r.t.Helper()
	closeNamedConnections(r.t, shared, r.vhost, r.vhost+"-"+role, patience)
}

// consumerTimeout gives the rig's (declared) queue a consumer timeout of d
// for channels opened before the returned function is called: from 4.0 a
// policy in the test's vhost (the policy key exists there); on 3.x the
// broker's global consumer_timeout, which a channel reads when it opens:
// set last, and put back as soon as the returned function runs (or the
// test ends), so that other tests' channels hardly ever see it. Before
// 4.3 the channel checks the timeout on its tick (every minute by
// default): when rabbitmqctl reaches the broker, the tick is shortened
// until the test ends. It returns how long detection may take.
func (r *rig) consumerTimeout(d time.Duration) (opened func(), detect time.Duration) {
	r.t.Helper()
	opened, detect = func() {}, d
	var ctl brokerCtl
	haveCtl := false
	if !r.atLeast(4, 3) { // from 4.3 the quorum queue keeps its own timer
		if ctl, haveCtl = r.ctlFor(); haveCtl {
			setBrokerEnv(r.t, ctl, "channel_tick_interval", 200)
			detect += time.Second
		} else {
			detect += time.Minute
		}
	}
	if r.atLeast(4, 0) {
		r.setPolicy(map[string]any{"consumer-timeout": d.Milliseconds()})
		return opened, detect
	}
	if !haveCtl {
		missing(r.t, "rabbitmqctl for the broker under test (TEST_RABBITMQCTL): 3.x has only a global consumer timeout")
	}
	return setBrokerEnv(r.t, ctl, "consumer_timeout", d.Milliseconds()), detect
}

// timedOut waits until the broker acts on a's overdue delivery: it closes
// a's channel (returned as the error) or cancels a's consumer.
func (s *sub) timedOut(within time.Duration) (closed *amqp.Error, cancelled bool) {
	s.t.Helper()
	select {
	case err := <-s.closes:
		return err, false
	case <-s.cancels:
		return nil, true
	case <-time.After(within):
		s.t.Fatalf("consumer %s: neither closed nor cancelled within %s of holding a delivery past the timeout", s.tag, within)
	}
	return nil, false
}
