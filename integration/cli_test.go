package integration

import (
	"fmt"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The commands' errors against a real broker say what to do, not only what
// the broker answered.

// dlq on a vhost where the topology was never declared names the queue it
// looked for, the settings that choose it, and the command that declares it,
// instead of the broker's bare 404.
func TestCLIDLQWithoutTheTopologySaysWhy(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	for _, cmd := range [][]string{{"dlq", "list"}, {"dlq", "replay", "--dry-run"}} {
		out, err := runCommand(t, []string{"AMQP_URL=" + e.amqpURL, "TOPOLOGY_PREFIX=" + prefix}, cmd...)
		if err == nil {
			t.Fatalf("%v succeeded on a vhost without the topology:\n%s", cmd, out)
		}
		for _, want := range []string{"no dead-letter queue " + prefix + ".dlq in this vhost", "TOPOLOGY_PREFIX", "transferconsumer topology"} {
			if !strings.Contains(out, want) {
				t.Errorf("%v does not say %q:\n%s", cmd, want, out)
			}
		}
	}
}

// topology with a QUEUE_COUNT above the queues that exist refuses to grow
// them (which would move accounts between queues while their older events
// wait) and points at repartition; with the count that exists it declares
// again, changing nothing.
func TestCLITopologyDoesNotGrowTheQueuesSilently(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(3)
	env := func(queues int) []string {
		return []string{"AMQP_URL=" + e.amqpURL, "TOPOLOGY_PREFIX=" + prefix, fmt.Sprintf("QUEUE_COUNT=%d", queues),
			fmt.Sprintf("DELIVERY_LIMIT=%d", e.limit)}
	}
	out, err := runCommand(t, env(5), "topology")
	if err == nil {
		t.Fatalf("topology grew 3 queues to 5:\n%s", out)
	}
	for _, want := range []string{"3 partition queues exist", "repartition --to 5", "QUEUE_COUNT=3"} {
		if !strings.Contains(out, want) {
			t.Errorf("topology's refusal does not say %q:\n%s", want, out)
		}
	}
	if _, ok := e.inspect(e.topology(5).Queue(3)); ok {
		t.Errorf("%s was declared all the same", e.topology(5).Queue(3))
	}
	if out, err := runCommand(t, env(3), "topology"); err != nil {
		t.Errorf("topology with the count that exists: %v\n%s", err, out)
	}
}

// With JOURNAL_STREAM set, topology also declares the journal's stream,
// with its retention, for a service that runs with DECLARE_TOPOLOGY=false.
func TestCLITopologyDeclaresTheJournal(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	stream := prefix + ".journal"
	out, err := runCommand(t, e.commandEnv(2, "JOURNAL_STREAM="+stream, "JOURNAL_MAX_AGE=3D"), "topology")
	if err != nil || !strings.Contains(out, "declared the journal, stream "+stream+" (x-max-age 3D)") {
		t.Fatalf("topology: %v\n%s", err, out)
	}
	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	declare := func(args amqp.Table) error {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		_, err = ch.QueueDeclare(stream, true, false, false, false, args)
		return err
	}
	if err := declare(amqp.Table{"x-queue-type": "stream", "x-max-age": "3D"}); err != nil {
		t.Errorf("the journal is not a stream with x-max-age 3D: %v", err)
	}
	if err := declare(amqp.Table{"x-queue-type": "quorum"}); err == nil {
		t.Errorf("the journal could be declared a quorum queue: it is not a stream")
	}
}
