package integration

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// On RabbitMQ 4.x single active consumer honours consumer priorities, so two
// replicas with REPLICA_COUNT=2 split the queues between them (adr/0004):
// each consumes its own half. When one is SIGKILLed the other takes its
// queues within seconds, loses nothing and keeps each account's order; when
// it comes back, its queues come back to it. The management API's consumer
// list shows the split, printed at each step.
func TestReplicasSplitTheQueuesOn4x(t *testing.T) {
	parallel(t)
	e := newEnvWith(t, broker4(t))
	e.declare(4)
	e.recordApplyOrder()
	replica := func(i int) *process {
		return startProcess(t, e.serviceEnv(4, fmt.Sprintf("INSTANCE_NAME=%s-r%d", e.name, i),
			"REPLICA_COUNT=2", fmt.Sprintf("REPLICA_INDEX=%d", i)))
	}
	own := func(q int) string { return fmt.Sprintf("%s-r%d", e.name, q%2) }
	r0, r1 := replica(0), replica(1)
	t.Logf("RabbitMQ %s, both replicas up: %s", brokerVersion(t, e.b), e.waitActive(4, own))

	events := lifecycleStream(1500, accountNames(12, e.name))
	var published atomic.Int64
	pubErr := make(chan error, 1)
	go func() { pubErr <- e.publishPipelined(events, &published) }()
	waitFor(t, 60*time.Second, "a third of the stream applied", func() bool { return e.inboxCount() >= len(events)/3 })
	r1.stop(syscall.SIGKILL, 10*time.Second)
	killed := time.Now()
	split := e.waitActive(4, func(int) string { return e.name + "-r0" })
	t.Logf("replica 1 SIGKILLed: replica 0 active on every queue after %s: %s", time.Since(killed).Round(time.Millisecond), split)
	if err := <-pubErr; err != nil {
		t.Fatal(err)
	}
	unique := uniqueEvents(events)
	waitFor(t, 90*time.Second, "every event applied", func() bool { return e.inboxCount() == unique })

	r1 = replica(1)
	back := time.Now()
	split = e.waitActive(4, own)
	t.Logf("replica 1 restarted: its queues back after %s: %s", time.Since(back).Round(time.Millisecond), split)
	// Many accounts, so that some route to the restarted replica's queues
	// whatever this run's names hash to: with a weight of 1 per queue the
	// exchange's ring has one point per queue, its arcs unequal, and twelve
	// accounts all landed on replica 0's queues in one run.
	more := lifecycleStream(400, accountNames(64, e.name+"_2"))
	if err := e.publishPipelined(more, &published); err != nil {
		t.Fatal(err)
	}
	all := append(events, more...)
	waitFor(t, 60*time.Second, "the second stream applied", func() bool { return e.inboxCount() == uniqueEvents(all) })
	if n := r1.count("outcome", "applied"); n == 0 {
		t.Error("the restarted replica applied nothing of the second stream")
	}
	for _, p := range []*process{r0, r1} {
		if err := p.stop(syscall.SIGTERM, 30*time.Second); err != nil {
			t.Errorf("exit after SIGTERM: %v", err)
		}
	}
	e.checkLifecycle(all)
	e.checkAccountOrder(all)
}

// waitActive waits until the active consumer of each of the first queues
// queues belongs to the instance want(i) names, and returns the split as the
// management API shows it.
func (e *env) waitActive(queues int, want func(i int) string) string {
	e.t.Helper()
	var split string
	waitFor(e.t, 60*time.Second, "the expected active consumer on every queue", func() bool {
		active := e.activeConsumers()
		var parts []string
		ok := true
		for i := 0; i < queues; i++ {
			q := e.topology(queues).Queue(i)
			parts = append(parts, q+"→"+active[q])
			ok = ok && active[q] == want(i)
		}
		split = strings.Join(parts, " ")
		return ok
	})
	return split
}

// activeConsumers returns, per queue of the test's vhost, the instance whose
// consumer is the single active one (consumer tags are instance/queue).
func (e *env) activeConsumers() map[string]string {
	e.t.Helper()
	var consumers []struct {
		Tag    string `json:"consumer_tag"`
		Active bool   `json:"active"`
		Queue  struct {
			Name string `json:"name"`
		} `json:"queue"`
	}
	e.b.mgmt(e.t, http.MethodGet, "/api/consumers/"+url.PathEscape(e.vhost), nil, &consumers)
	out := map[string]string{}
	for _, c := range consumers {
		if c.Active {
			out[c.Queue.Name] = strings.TrimSuffix(c.Tag, "/"+c.Queue.Name)
		}
	}
	return out
}
