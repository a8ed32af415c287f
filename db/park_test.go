package db

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"runtime"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/event"
)

// A dead letter parked during a broker alarm keeps a NUL in a header, and
// one in a property does not keep it from being parked.
func TestParkKeepsAHeaderWithANUL(t *testing.T) {
	database := testDB(t, 4)
	in := NewInbox(database)
	ctx := context.Background()
	headers := event.HeadersJSON(amqp.Table{"x-note": "a\x00b"})
	if err := in.Park(ctx, event.OutboxLetter{
		EventType: "Transfer\x00Created", Class: "poison", Reason: "not an event\x00",
		RoutingKey: "acc_\x00a", MessageID: "id\x00", ContentType: "text/\xff", Body: []byte("\x00"),
		Headers: headers, Queue: "transfers.0", At: time.Now(),
	}); err != nil {
		t.Fatalf("park: %v", err)
	}
	got := drainAll(t, in)
	if len(got) != 1 || !bytes.Equal(got[0].Headers, headers) || got[0].RoutingKey != "acc_a" || !bytes.Equal(got[0].Body, []byte("\x00")) {
		t.Errorf("drained %+v, want the parked letter with headers %s", got, headers)
	}
}

// A letter parked while its own publish, cut short by an alarm, awaits the
// broker's answer is held back from the drain; a confirm drops it, any
// other answer lets the drain publish it.
func TestParkedLetterWaitsForItsAbandonedPublish(t *testing.T) {
	database := testDB(t, 4)
	in := NewInbox(database)
	ctx := context.Background()
	drain := func() []string {
		var got []string
		if _, err := in.DrainOutbox(ctx, func(l event.OutboxLetter) error {
			got = append(got, l.MessageID)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	park := func(id string) chan error {
		answer := make(chan error, 1)
		if err := in.Park(ctx, event.OutboxLetter{Class: "poison", Reason: "not JSON", RoutingKey: "acc_a",
			MessageID: id, Body: []byte("x"), Queue: "transfers.0", At: time.Now(), Abandoned: answer}); err != nil {
			t.Fatalf("park: %v", err)
		}
		return answer
	}
	rows := func() int {
		var n int
		if err := database.Get(&n, `SELECT count(*) FROM dead_letter_outbox`); err != nil {
			t.Fatal(err)
		}
		return n
	}
	confirmed, nacked := park("confirmed"), park("nacked")
	if got := drain(); len(got) != 0 {
		t.Fatalf("drained %v while their publishes await an answer", got)
	}
	confirmed <- nil
	nacked <- errors.New("channel closed")
	deadline := time.Now().Add(10 * time.Second)
	for rows() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d rows: the confirmed letter was not dropped", rows())
		}
		runtime.Gosched()
	}
	var got []string
	for len(got) == 0 && time.Now().Before(deadline) {
		got = drain() // the nacked one's lock may take a moment to go
	}
	if len(got) != 1 || got[0] != "nacked" {
		t.Errorf("drained %v, want the letter whose publish was not confirmed", got)
	}
}

// Parking a dead letter is one Query message and its answer, as an
// attempt is: with parameters, outside a transaction, lib/pq would send
// the INSERT in two exchanges (Parse, then Bind and Execute), which
// PgBouncer in transaction mode may hand to two server connections. The
// letter, quotes and backslashes included, is read back as written.
func TestParkIsOneRoundTrip(t *testing.T) {
	url := testDBURL(t)
	database, d := openCounted(t, url, 4)
	ctx := t.Context()
	in := NewInbox(database)
	letter := event.OutboxLetter{EventID: newID(), EventType: "TransferCreated", Class: "poison", Reason: `it's not JSON: \x`,
		RoutingKey: `acc_'\`, MessageID: "m-" + newID(), ContentType: "application/json", Body: []byte(`{"a": '\`),
		Headers: []byte(`{"x-producer":"p'\\"}`), Queue: "transfers.0", At: time.Now()}
	// The first park opens the pool's connection; the second finds it idle.
	if err := in.Park(ctx, event.OutboxLetter{Class: "poison", Reason: "warm", RoutingKey: "acc_a", Body: []byte("x"), Queue: "transfers.0"}); err != nil {
		t.Fatal(err)
	}

	before := d.writes.Load()
	err := in.Park(ctx, letter)
	if n := d.writes.Load() - before; n != 1 {
		t.Errorf("parking a letter took %d writes, want one", n)
	}
	if err != nil {
		t.Fatal(err)
	}
	got := drainAll(t, in)
	if len(got) != 2 {
		t.Fatalf("drained %d letters, want 2", len(got))
	}
	g := got[1]
	if g.EventID != letter.EventID || g.EventType != letter.EventType || g.Class != letter.Class || g.Reason != letter.Reason ||
		g.RoutingKey != letter.RoutingKey || g.MessageID != letter.MessageID || g.ContentType != letter.ContentType ||
		!bytes.Equal(g.Body, letter.Body) || !sameJSON(g.Headers, letter.Headers) || g.Queue != letter.Queue || !g.Parked {
		t.Errorf("drained %+v, want %+v", g, letter)
	}
	if w := got[0]; w.EventID != "" || w.MessageID != "" || w.ContentType != "" || w.Headers != nil {
		t.Errorf("a letter without an event id, message id, content type or headers drained as %+v", w)
	}
}

// sameJSON reports whether a and b are the same JSON value (jsonb spaces
// its text as it likes).
func sameJSON(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

// drainAll drains in's outbox and returns the letters it held, in order.
func drainAll(t *testing.T, in *Inbox) []event.OutboxLetter {
	t.Helper()
	var got []event.OutboxLetter
	if _, err := in.DrainOutbox(t.Context(), func(l event.OutboxLetter) error {
		got = append(got, l)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}
