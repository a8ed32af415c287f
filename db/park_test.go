package db

import (
	"bytes"
	"context"
	"errors"
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
	var got []event.OutboxLetter
	if _, err := in.DrainOutbox(ctx, func(l event.OutboxLetter) error {
		got = append(got, l)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
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
