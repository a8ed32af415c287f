package integration

import (
	"net/http"
	"net/url"
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
	out, stderr, err := e.command(nil, withAPI, "dlq", "list")
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
