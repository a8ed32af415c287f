package dlq

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func TestQueueArgsHaveNoDeliveryLimitThatDrops(t *testing.T) {
	tests := []struct {
		version string
		limit   any
		has     bool
	}{
		{"3.10.8", nil, false}, // 3.x: no limit unless set; -1 would drop on first return
		{"3.13.7", nil, false},
		{"4.0.5", int64(-1), true}, // 4.x: the default 20 must be switched off
		{"4.3.0", int64(-1), true},
		{"", nil, false},
	}
	for _, tt := range tests {
		limit, has := QueueArgs(tt.version)["x-delivery-limit"]
		if has != tt.has || limit != tt.limit {
			t.Errorf("%q: x-delivery-limit = %v (set %v), want %v (set %v)", tt.version, limit, has, tt.limit, tt.has)
		}
	}
}

// BrokerVersion is what QueueArgs, topology's Verify and the cli's DLQ
// guard decide by: 4.x against 3.x, and 4.3 against 4.0–4.2.
func TestBrokerVersionReadsMajorAndMinor(t *testing.T) {
	tests := []struct {
		version      string
		major, minor int
	}{
		{"3.13.7", 3, 13},
		{"4.0.5", 4, 0},
		{"4.3.0", 4, 3},
		{"4.3", 4, 3},
		{"4", 4, 0},
		{"4.2.0-rc.1", 4, 2},
		{"4.x.1", 4, 0}, // an unreadable part is 0
		{"v4.1.0", 0, 1},
		{"", 0, 0},
	}
	for _, tt := range tests {
		if major, minor := BrokerVersion(tt.version); major != tt.major || minor != tt.minor {
			t.Errorf("BrokerVersion(%q) = %d, %d, want %d, %d", tt.version, major, minor, tt.major, tt.minor)
		}
	}
}

func TestCopyKeepsTheMessageAndSaysWhy(t *testing.T) {
	at := time.Date(2026, 7, 10, 12, 0, 0, 0, time.UTC)
	d := amqp.Delivery{
		Exchange: "transfers", RoutingKey: "acc_00001", Body: []byte("body"),
		MessageId: "id-1", Type: "TransferCreated", ContentType: "application/json", UserId: "producer",
		Headers: amqp.Table{"traceparent": "00-abc-def-01", "x-delivery-count": int64(2)},
	}
	msg := Copy(d, Failure{Class: "poison", Reason: strings.Repeat("é", 3000), Queue: "transfers.4", Instance: "host-1", At: at})

	if string(msg.Body) != "body" || msg.MessageId != "id-1" || msg.Type != "TransferCreated" || msg.DeliveryMode != amqp.Persistent {
		t.Errorf("the copy changed the message: %+v", msg)
	}
	if msg.UserId != "" {
		t.Error("user_id kept: the broker would refuse the publish")
	}
	want := map[string]any{
		HeaderClass: "poison", HeaderOriginalQueue: "transfers.4", HeaderOriginalExchange: "transfers",
		HeaderOriginalKey: "acc_00001", HeaderFailedBy: "host-1", HeaderFailedAt: "2026-07-10T12:00:00Z",
		HeaderDeliveryCount: int64(2), "traceparent": "00-abc-def-01",
	}
	for k, v := range want {
		if msg.Headers[k] != v {
			t.Errorf("header %s = %v, want %v", k, msg.Headers[k], v)
		}
	}
	if _, ok := msg.Headers["x-delivery-count"]; ok {
		t.Error("x-delivery-count copied; the DLQ counts its own deliveries under that name")
	}
	reason := msg.Headers[HeaderReason].(string)
	if len(reason) > maxReason+len("…") || !strings.HasSuffix(reason, "…") {
		t.Errorf("reason not truncated to %d bytes: %d", maxReason, len(reason))
	}
	if err := msg.Headers.Validate(); err != nil {
		t.Errorf("headers are not a valid AMQP table: %v", err)
	}
}

func TestFilter(t *testing.T) {
	now := time.Now()
	l := Letter{EventID: "e1", Class: "poison", Reason: "data.amountMinor -1 is not positive", FailedAt: now.Add(-time.Hour)}
	tests := []struct {
		f    Filter
		want bool
	}{
		{Filter{}, true},
		{Filter{Class: "poison"}, true},
		{Filter{Class: "delivery_limit"}, false},
		{Filter{Reason: "amountMinor"}, true},
		{Filter{Reason: "currency"}, false},
		{Filter{EventID: "e2"}, false},
		{Filter{FailedAfter: now.Add(-2 * time.Hour)}, true},
		{Filter{FailedAfter: now.Add(-30 * time.Minute)}, false}, // older than the retention window
		{Filter{Class: "poison", EventID: "e1", FailedAfter: now.Add(-2 * time.Hour)}, true},
	}
	for i, tt := range tests {
		if got := tt.f.Match(l); got != tt.want {
			t.Errorf("%d: %+v.Match = %v, want %v", i, tt.f, got, tt.want)
		}
	}
}
