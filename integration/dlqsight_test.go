package integration

import (
	"bytes"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
)

// A reader of the DLQ cannot get the letters another reader holds
// unacknowledged, and nothing in AMQP counts them: with MANAGEMENT_URL set,
// every reader compares what it got with the broker's own count. Three
// letters, two held by another channel: dlq list names the two it did not
// see, replay and drop say so when they finish, reconcile --require-dlq
// fails with its own exit status after its wait; without MANAGEMENT_URL
// they say that they could not check. Once the holder lets go, all three
// are there, and seen.
func TestDLQReadSaysWhatItDidNotSee(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(2)
	e.deadLetters(letter{newUUID(), "poison", "one", []byte(`{}`)}, letter{newUUID(), "poison", "two", []byte(`{}`)},
		letter{newUUID(), "poison", "three", []byte(`{}`)})
	queue := dlq.Queue(prefix)
	count := func() (messages, unacked int) {
		var q struct {
			Messages *int `json:"messages"`
			Unacked  *int `json:"messages_unacknowledged"`
		}
		e.b.mgmt(t, http.MethodGet, "/api/queues/"+url.PathEscape(e.vhost)+"/"+url.PathEscape(queue), nil, &q)
		if q.Messages == nil || q.Unacked == nil {
			return -1, -1
		}
		return *q.Messages, *q.Unacked
	}
	waitFor(t, 30*time.Second, "the broker's statistics to count the 3 letters", func() bool { m, _ := count(); return m == 3 })

	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	holder, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	for range 2 {
		d, ok, err := holder.Get(queue, false)
		if err != nil || !ok {
			t.Fatalf("the holder's get: %v, %v", ok, err)
		}
		last = d.DeliveryTag
	}
	waitFor(t, 30*time.Second, "the broker's statistics to count 2 held", func() bool { _, u := count(); return u == 2 })

	withAPI := []string{"MANAGEMENT_URL=" + e.b.managementURL}
	out, stderr, err := e.command(nil, withAPI, "dlq", "list", "--wait", "1s")
	if err != nil || !strings.Contains(out, ": 1 dead letter(s)") ||
		!strings.Contains(out, "2 dead letter(s) not seen: held by another reader (the broker counts 3, 2 of them unacknowledged") {
		t.Errorf("dlq list with 2 of 3 letters held: %v\n%s%s", err, out, stderr)
	}
	out, stderr, err = e.command(nil, nil, "dlq", "list")
	if err != nil || !strings.Contains(out, "not checked whether another reader holds letters: MANAGEMENT_URL is not set") {
		t.Errorf("dlq list without MANAGEMENT_URL: %v\n%s%s", err, out, stderr)
	}
	out, stderr, err = e.command(nil, withAPI, "dlq", "replay", "--dry-run", "--class", "poison")
	if err != nil || !strings.Contains(out, "2 dead letter(s) not seen: held by another reader") {
		t.Errorf("dlq replay --dry-run with 2 letters held: %v\n%s%s", err, out, stderr)
	}
	out, stderr, err = e.command(nil, withAPI, "dlq", "drop", "--dry-run", "--class", "poison")
	if err != nil || !strings.Contains(out+stderr, "2 dead letter(s) not seen: held by another reader") {
		t.Errorf("dlq drop --dry-run with 2 letters held: %v\n%s%s", err, out, stderr)
	}
	rec := func(args ...string) (string, string, int) {
		t.Helper()
		out, stderr, err := e.command(nil, withAPI, append([]string{"reconcile"}, args...)...)
		code := 0
		if exit, ok := err.(interface{ ExitCode() int }); ok {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out, stderr, code
	}
	if out, stderr, code := rec("--require-dlq", "--dlq-wait", "2s"); code != 4 ||
		!strings.Contains(stderr, "not read whole (--require-dlq): 2 dead letter(s) not seen: held by another reader") {
		t.Errorf("reconcile --require-dlq with 2 letters held: exit %d, want 4\n%s%s", code, out, stderr)
	}
	if out, stderr, code := rec(); code != 0 || !strings.Contains(out, "2 dead letter(s) not seen") {
		t.Errorf("reconcile (the DLQ read, not required) with 2 letters held: exit %d, want 0 and the letters named\n%s%s", code, out, stderr)
	}

	if err := holder.Nack(last, true, true); err != nil {
		t.Fatal(err)
	}
	out, stderr, err = e.command(nil, withAPI, "dlq", "list")
	if err != nil || !strings.Contains(out, ": 3 dead letter(s)") || strings.Contains(out, "not seen") {
		t.Errorf("dlq list once the holder let go: %v\n%s%s", err, out, stderr)
	}
	if out, stderr, code := rec("--require-dlq", "--dlq-wait", "30s"); code != 0 {
		t.Errorf("reconcile --require-dlq once the holder let go: exit %d, want 0\n%s%s", code, out, stderr)
	}
}

// A DLQ declared as an estate's administrator might, a quorum queue with no
// x-delivery-limit, has RabbitMQ 4.x's default limit of 20: on 4.0–4.2
// every return of a letter counts, so every read would spend one of each
// letter's deliveries until the broker drops it. Every dlq command warns
// before it reads, and refuses to spend one without --spend-deliveries,
// with and without the management API. On 3.x such a queue has no limit,
// and from 4.3 the commands' returns (basic.nack) do not count: they read,
// and on 4.3 they warn that other looks do count.
func TestDLQWithALimitIsNotSpentByLooking(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(2)
	queue := dlq.Queue(prefix)
	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	version, _ := conn.Properties["version"].(string)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "", dlq.Exchange(prefix), false, nil); err != nil {
		t.Fatal(err)
	}
	e.deadLetters(letter{newUUID(), "poison", "kept", []byte(`{}`)})

	var major, minor int
	fmt.Sscanf(version, "%d.%d", &major, &minor)
	spends := major == 4 && minor < 3
	for _, extra := range [][]string{nil, {"MANAGEMENT_URL=" + e.b.managementURL}} {
		for _, args := range [][]string{{"dlq", "list"}, {"dlq", "replay", "--dry-run", "--class", "poison"},
			{"dlq", "drop", "--dry-run", "--class", "poison"}} {
			out, stderr, err := e.command(nil, extra, args...)
			switch {
			case spends && (err == nil || !strings.Contains(stderr, "would spend one delivery of each letter") || !strings.Contains(stderr, "--spend-deliveries")):
				t.Errorf("RabbitMQ %s, %v %v: %v, want a refusal that names --spend-deliveries\n%s%s", version, extra, args, err, out, stderr)
			case major == 4 && minor >= 3 && (err != nil || !strings.Contains(stderr, "warning: "+queue+" can drop letters")):
				t.Errorf("RabbitMQ %s, %v %v: %v, want a read with a warning\n%s%s", version, extra, args, err, out, stderr)
			case major < 4 && (err != nil || strings.Contains(stderr, "warning")):
				t.Errorf("RabbitMQ %s, %v %v: %v, want a read with no warning\n%s%s", version, extra, args, err, out, stderr)
			}
		}
		if e.ready(queue) != 1 {
			t.Fatalf("the letter left the DLQ")
		}
	}
	if spends {
		out, stderr, err := e.command(nil, nil, "dlq", "list", "--spend-deliveries")
		if err != nil || !strings.Contains(out, ": 1 dead letter(s)") || !strings.Contains(stderr, "warning: reading spends one delivery") {
			t.Errorf("dlq list --spend-deliveries on %s: %v\n%s%s", version, err, out, stderr)
		}
	}
	// Nothing was spent but the one explicit read: the letter's next
	// delivery shows how many returns the broker counted.
	d, ok, err := ch.Get(queue, false)
	if err != nil || !ok {
		t.Fatalf("the letter: %v, %v", ok, err)
	}
	if n, _ := d.Headers["x-delivery-count"].(int64); spends && n != 1 {
		t.Errorf("x-delivery-count %d after one read with --spend-deliveries, want 1", n)
	}
	d.Nack(false, true)
}

// Looking at a letter of the service's own DLQ, 30 times through the
// management API's "Get messages" and 30 times with dlq list, leaves it
// there, on every broker version.
func TestThirtyLooksLeaveTheLetter(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(2)
	e.deadLetters(letter{newUUID(), "poison", "looked at", []byte(`{}`)})
	for i := range 30 {
		if n := len(e.peekDLQ()); n != 1 {
			t.Fatalf("look %d through the management API: %d letters, want 1", i+1, n)
		}
	}
	for i := range 30 {
		out, stderr, err := e.command(nil, nil, "dlq", "list")
		if err != nil || !strings.Contains(out, ": 1 dead letter(s)") || strings.Contains(stderr, "warning") {
			t.Fatalf("dlq list %d: %v\n%s%s", i+1, err, out, stderr)
		}
	}
	if n := e.ready(dlq.Queue(prefix)); n != 1 {
		t.Errorf("%d letters after 60 looks, want 1", n)
	}
}

// A dlq list while a replay holds letters waiting for its confirms gives a
// complete answer: it reads again until it sees every letter the broker
// counts, which it does once the replay lets go.
func TestDLQListDuringAReplayIsWhole(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(2)
	queue := dlq.Queue(prefix)
	var letters []letter
	for range 600 {
		letters = append(letters, letter{newUUID(), "data-rejected", "fixed since", []byte(`{}`)})
	}
	e.deadLetters(letters...)
	waitFor(t, 30*time.Second, "the broker's statistics to count the letters", func() bool {
		var q struct {
			Messages int `json:"messages"`
		}
		e.b.mgmt(t, http.MethodGet, "/api/queues/"+url.PathEscape(e.vhost)+"/"+url.PathEscape(queue), nil, &q)
		return q.Messages == len(letters)
	})
	withAPI := []string{"MANAGEMENT_URL=" + e.b.managementURL}
	replay := exec.Command(buildService(t), "dlq", "replay", "--class", "data-rejected")
	replay.Env = append(os.Environ(), e.commandEnv(2, withAPI...)...)
	var replayOut bytes.Buffer
	replay.Stdout, replay.Stderr = &replayOut, &replayOut
	if err := replay.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the replay to take letters", func() bool { return e.ready(queue) < len(letters) })
	out, stderr, err := e.command(nil, withAPI, "dlq", "list", "--wait", "60s")
	if werr := replay.Wait(); werr != nil {
		t.Fatalf("replay: %v\n%s", werr, replayOut.String())
	}
	if err != nil || strings.Contains(out, "not seen") || strings.Contains(out, "not checked") || !strings.Contains(out, queue+": ") {
		t.Errorf("dlq list during a replay: %v\n%s%s\nthe replay:\n%s", err, out, stderr, replayOut.String())
	}
	t.Logf("the list during the replay: %s", strings.SplitN(out, "\n", 2)[0])
}
