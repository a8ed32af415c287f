package dlq

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A letter's first producer, for each way a letter comes to the DLQ: the
// service's copy says it in its header; the broker's own dead letter is
// the message as published, believed about the header only from a
// replaying user.
func TestLetterProducer(t *testing.T) {
	death := []interface{}{amqp.Table{"reason": "delivery_limit", "queue": "transfers.0", "count": int64(1)}}
	replayer := func(u string) bool { return u == "ops-replay" }
	tests := []struct {
		name    string
		d       amqp.Delivery
		want    string
		wantAny string // with no replaying user known
	}{
		{"service copy", amqp.Delivery{Headers: amqp.Table{HeaderClass: "unauthorized", HeaderOriginalUser: "mallory"}}, "mallory", "mallory"},
		{"service copy from before the header", amqp.Delivery{Headers: amqp.Table{HeaderClass: "poison"}}, "", ""},
		{"broker letter", amqp.Delivery{UserId: "payments-api", Headers: amqp.Table{"x-death": death}}, "payments-api", "payments-api"},
		{"broker letter, forged header", amqp.Delivery{UserId: "mallory",
			Headers: amqp.Table{"x-death": death, HeaderOriginalUser: "payments-api"}}, "mallory", "mallory"},
		{"broker letter, forged header and class", amqp.Delivery{UserId: "mallory",
			Headers: amqp.Table{"x-death": death, HeaderClass: "data-rejected", HeaderOriginalUser: "payments-api"}}, "mallory", "mallory"},
		{"broker letter without user_id", amqp.Delivery{Headers: amqp.Table{"x-death": death, HeaderOriginalUser: "payments-api"}}, "", ""},
		{"broker letter of a replay", amqp.Delivery{UserId: "ops-replay",
			Headers: amqp.Table{"x-death": death, HeaderOriginalUser: "payments-api"}}, "payments-api", "ops-replay"},
		{"copy with a forged x-death", amqp.Delivery{Headers: amqp.Table{"x-death": death, HeaderOriginalUser: "payments-api"}}, "", ""},
	}
	for _, tt := range tests {
		if got := LetterProducer(tt.d, replayer); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
		if got := LetterProducer(tt.d, nil); got != tt.wantAny {
			t.Errorf("%s, no replaying users: %q, want %q", tt.name, got, tt.wantAny)
		}
	}
}

// What a replay puts back: none of the failure headers, the letter's
// x-original-user-id replaced by the producer judged, others kept.
func TestReplayHeadersKeepTheFirstProducer(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	from := amqp.Table{HeaderClass: "unauthorized", HeaderOriginalUser: "forged", HeaderOriginalQueue: "transfers.0",
		"x-death": []interface{}{}, "x-delivery-count": int64(2), "traceparent": "00-abc"}
	h := replayHeaders(from, "run1", "payments-api", at)
	want := amqp.Table{HeaderOriginalUser: "payments-api", HeaderReplayRun: "run1",
		HeaderReplayedAt: "2026-01-02T03:04:05Z", HeaderReplayCount: int64(1), "traceparent": "00-abc"}
	if len(h) != len(want) {
		t.Fatalf("headers %v, want %v", h, want)
	}
	for k, v := range want {
		if h[k] != v {
			t.Errorf("%s = %v, want %v", k, h[k], v)
		}
	}
	if h := replayHeaders(from, "run1", "", at); h[HeaderOriginalUser] != nil {
		t.Errorf("no producer, yet x-original-user-id = %v", h[HeaderOriginalUser])
	}
}

// The replaying user is the connection's, from its PLAIN or AMQPLAIN
// credentials, and is one of the users whose replays are believed.
func TestCustody(t *testing.T) {
	conn := &amqp.Connection{Config: amqp.Config{SASL: []amqp.Authentication{&amqp.PlainAuth{Username: "ops"}}}}
	if u := connUser(conn); u != "ops" {
		t.Errorf("connUser = %q", u)
	}
	conn.Config.SASL = []amqp.Authentication{&amqp.ExternalAuth{}}
	if u := connUser(conn); u != "" {
		t.Errorf("connUser with EXTERNAL = %q", u)
	}
	c := Custody{User: "ops", Replayers: strings.Split("ops-2, ,", ",")}
	for u, want := range map[string]bool{"ops": true, "ops-2": true, "": false, "payments-api": false} {
		if c.replayer(u) != want {
			t.Errorf("replayer(%q) = %v", u, !want)
		}
	}
	if (Custody{}).replayer("") {
		t.Error("no user is a replayer")
	}
}
