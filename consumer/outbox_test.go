package consumer

import (
	"reflect"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/event"
)

// Headers kept for a dead letter come back as they went, whole numbers as
// int64; the broker's delivery count is not kept.
func TestHeadersSurviveTheDatabase(t *testing.T) {
	at := time.Date(2026, 7, 10, 12, 0, 0, 0, time.UTC)
	in := amqp.Table{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "n": int32(7), "ok": true,
		"nested": amqp.Table{"k": "v"}, "list": []any{"a", int64(2)}, "at": at, "x-delivery-count": int64(3),
	}
	want := amqp.Table{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "n": int64(7), "ok": true,
		"nested": amqp.Table{"k": "v"}, "list": []any{"a", int64(2)}, "at": "2026-07-10T12:00:00Z",
	}
	if got := tableFromJSON(event.HeadersJSON(in)); !reflect.DeepEqual(got, want) {
		t.Errorf("got %#v\nwant %#v", got, want)
	}
	if event.HeadersJSON(nil) != nil || tableFromJSON(nil) != nil {
		t.Error("no headers should stay none")
	}
}
