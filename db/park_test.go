package db

import (
	"bytes"
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/consumer"
)

// A dead letter parked during a broker alarm keeps a NUL in a header, and
// one in a property does not keep it from being parked.
func TestParkKeepsAHeaderWithANUL(t *testing.T) {
	database := testDB(t, 4)
	in := NewInbox(database)
	ctx := context.Background()
	headers := consumer.HeadersJSON(amqp.Table{"x-note": "a\x00b"})
	if err := in.Park(ctx, consumer.OutboxLetter{
		EventType: "Transfer\x00Created", Class: "poison", Reason: "not an event\x00",
		RoutingKey: "acc_\x00a", MessageID: "id\x00", ContentType: "text/\xff", Body: []byte("\x00"),
		Headers: headers, Queue: "transfers.0", At: time.Now(),
	}); err != nil {
		t.Fatalf("park: %v", err)
	}
	var got []consumer.OutboxLetter
	if _, err := in.DrainOutbox(ctx, func(l consumer.OutboxLetter) error {
		got = append(got, l)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !bytes.Equal(got[0].Headers, headers) || got[0].RoutingKey != "acc_a" || !bytes.Equal(got[0].Body, []byte("\x00")) {
		t.Errorf("drained %+v, want the parked letter with headers %s", got, headers)
	}
}
