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

// On a three-node RabbitMQ 4.x cluster, with AMQP_URL listing the nodes and
// events flowing on 8 queues, a node stops and later starts again: first the
// node that leads the most queues among those the service is not connected
// to, then the node the service is connected to. Nothing is lost,
// dead-lettered or applied twice, each account keeps its order, and the
// service is back on every queue within seconds; the test prints the
// figures. The queues' leaders are spread over the nodes from the start.
//
// Each round publishes part of its stream before the stop and holds the
// rest back until the node is down, so that events are applied after the
// loss however fast the service drained the first part. A stopped node is
// started again in t.Cleanup too, so that a failed run leaves the cluster
// whole for the next.
//
// It runs twice: without the journal, and with it (JOURNAL_STREAM), whose
// stream has a replica on each node and loses its leader or the node its
// connection is on in the rounds too. With the journal, every event
// applied is also in the stream once the run is over.
func TestClusterNodeLossLosesNothing(t *testing.T) {
	parallel(t)
	b, ctl := cluster(t)
	t.Run("without the journal", func(t *testing.T) { nodeLoss(t, b, ctl, "") })
	t.Run("with the journal", func(t *testing.T) { nodeLoss(t, b, ctl, prefix+".journal") })
}

func nodeLoss(t *testing.T, b backend, ctl clusterCtl, journal string) {
	e := newEnvWith(t, b)
	e.recordApplyOrder()
	urls := e.nodeURLs()
	names := make([]string, len(b.nodes)) // the node behind each URL
	for i, m := range append([]string{b.managementURL}, b.managementURLs...) {
		var o struct {
			Node string `json:"node"`
		}
		backend{managementURL: m}.mgmt(t, http.MethodGet, "/api/overview", nil, &o)
		names[i] = o.Node
	}
	proc := startProcess(t, e.serviceEnv(8, "AMQP_URL="+strings.Join(urls, ","), "INSTANCE_NAME="+e.name,
		"JOURNAL_STREAM="+journal))
	e.waitActive(8, func(int) string { return e.name })
	leaders := e.leaders()
	t.Logf("RabbitMQ %s cluster %v; queue leaders per node: %v", brokerVersion(t, b), names, countByNode(leaders))
	if len(countByNode(leaders)) < 2 {
		t.Errorf("every queue's leader is on one node: %v", leaders)
	}

	var all []transfer
	var published atomic.Int64
	round := func(what string, pick func(service string) string) {
		service := e.serviceNode()
		stop := pick(service)
		var via string // a node that stays up, for the test's publisher
		for i, n := range names {
			if n != stop {
				via = urls[i]
				break
			}
		}
		accounts := accountNames(16, fmt.Sprintf("%s_%d", e.name, len(all)))
		batch, held := lifecycleStream(1500, accounts), lifecycleStream(300, accounts)
		all = append(append(all, batch...), held...)
		before := e.inboxCount()
		redelivered, duplicates := proc.count("redelivered", "true"), proc.count("outcome", "duplicate")
		pubErr := make(chan error, 1)
		go func() { pubErr <- e.publishPipelinedTo(via, batch, &published) }()
		waitFor(t, 60*time.Second, "a quarter of the batch applied", func() bool { return e.inboxCount() >= before+len(batch)/4 })

		led := e.leaders()
		t.Cleanup(func() { ctl.start(t, nodeShort(stop)) }) // harmless when the round has started it
		asked := time.Now()
		ctl.node(nodeShort(stop)).run(t, "shutdown") // returns once the node is down
		stopped := time.Now()
		applied := e.inboxCount()
		// The held part follows the batch, so that each account's events
		// are published in the order of all; through via, which stays up.
		if err := <-pubErr; err != nil {
			t.Fatalf("%s: publish: %v", what, err)
		}
		go func() { pubErr <- e.publishPipelinedTo(via, held, &published) }()
		e.waitActive(8, func(int) string { return e.name })
		waitFor(t, 60*time.Second, "events applied again", func() bool { return e.inboxCount() > applied })
		resumed := time.Since(stopped)
		if err := <-pubErr; err != nil {
			t.Fatalf("%s: publish after the stop: %v", what, err)
		}
		waitFor(t, 120*time.Second, "the batch and the held events applied", func() bool { return e.inboxCount() == uniqueEvents(all) })
		ctl.start(t, nodeShort(stop))
		t.Logf("%s: stopped %s (it led %d of 8 queues; the service was on %s, now on %s) in %s; every queue consumed and "+
			"events applied again %s after it was down; %d redeliveries; %d duplicates absorbed by the inbox, %d of them published as such",
			what, stop, countByNode(led)[stop], service, e.serviceNode(), stopped.Sub(asked).Round(time.Millisecond),
			resumed.Round(time.Millisecond), proc.count("redelivered", "true")-redelivered,
			proc.count("outcome", "duplicate")-duplicates, len(batch)-uniqueEvents(batch)+len(held)-uniqueEvents(held))
	}
	round("leader loss", func(service string) string {
		best, most := "", -1
		for node, n := range countByNode(e.leaders()) {
			if node != service && n > most {
				best, most = node, n
			}
		}
		if best == "" { // the service's node leads everything: take another
			for _, n := range names {
				if n != service {
					best = n
				}
			}
		}
		return best
	})
	round("loss of the service's node", func(service string) string { return service })

	if err := proc.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	if n := proc.count("outcome", "dead_lettered"); n != 0 {
		t.Errorf("%d events dead-lettered", n)
	}
	e.checkLifecycle(all)
	e.checkAccountOrder(all)
	if journal != "" {
		journaled := e.journaled(urls, journal)
		missing := 0
		for _, tr := range all {
			if e.inboxRows(tr.EventID) > 0 && !journaled[tr.EventID] {
				missing++
			}
		}
		if missing > 0 {
			t.Errorf("%d applied events are not in the journal", missing)
		}
		t.Logf("the journal holds %d events", len(journaled))
	}
}

// leaders returns each queue of the test's vhost with its leader's node.
func (e *env) leaders() map[string]string {
	e.t.Helper()
	var queues []struct {
		Name   string `json:"name"`
		Leader string `json:"leader"`
	}
	e.b.mgmt(e.t, http.MethodGet, "/api/queues/"+url.PathEscape(e.vhost)+"?columns=name,leader", nil, &queues)
	out := map[string]string{}
	for _, q := range queues {
		if strings.HasPrefix(q.Name, prefix+".") && q.Name != prefix+".dlq" && q.Name != prefix+".journal" {
			out[q.Name] = q.Leader
		}
	}
	return out
}

// serviceNode returns the node the service's consuming connection is on.
func (e *env) serviceNode() string {
	e.t.Helper()
	var node string
	waitFor(e.t, 30*time.Second, "the service's connection to be listed", func() bool {
		var conns []struct {
			Node  string `json:"node"`
			Props struct {
				Name string `json:"connection_name"`
			} `json:"client_properties"`
		}
		e.b.mgmt(e.t, http.MethodGet, "/api/vhosts/"+url.PathEscape(e.vhost)+"/connections", nil, &conns)
		for _, c := range conns {
			if c.Props.Name == e.name {
				node = c.Node
			}
		}
		return node != ""
	})
	return node
}

func countByNode(leaders map[string]string) map[string]int {
	out := map[string]int{}
	for _, n := range leaders {
		out[n]++
	}
	return out
}

// nodeShort is a node's name without its host: rabbitc2@localhost → rabbitc2.
func nodeShort(node string) string { return strings.SplitN(node, "@", 2)[0] }
