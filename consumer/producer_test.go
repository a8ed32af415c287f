package consumer

import (
	"context"
	"reflect"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
	"transferconsumer/event"
)

// Each way a message can show its producer, judged against one allow-list:
// only a listed first producer passes, a header is believed only from a
// replaying user, and every reason names the user or its absence.
func TestProducersAdmit(t *testing.T) {
	p, err := NewProducers(" payments-api, ledger-import ,,", "ops-replay")
	if err != nil {
		t.Fatal(err)
	}
	orig := func(u string) amqp.Table { return amqp.Table{dlq.HeaderOriginalUser: u, "x-other": int64(1)} }
	tests := []struct {
		name     string
		userID   string
		headers  amqp.Table
		producer string // x-original-user-id after Admit; "" when absent
		reason   string // "" when admitted
	}{
		{"listed", "payments-api", nil, "payments-api", ""},
		{"the other listed", "ledger-import", amqp.Table{}, "ledger-import", ""},
		{"unlisted", "mallory", nil, "mallory", `user_id "mallory" is not in PRODUCERS`},
		{"no user_id", "", nil, "", "no user_id property"},
		{"no user_id, a claim in a header", "", orig("payments-api"), "", "no user_id property"},
		{"unlisted, claiming a listed one", "mallory", orig("payments-api"), "mallory", `user_id "mallory" is not in PRODUCERS`},
		{"listed, its header replaced", "payments-api", orig("mallory"), "payments-api", ""},
		{"case matters", "Payments-API", nil, "Payments-API", `"Payments-API" is not in PRODUCERS`},
		{"replayed, listed first producer", "ops-replay", orig("ledger-import"), "ledger-import", ""},
		{"replayed, unlisted first producer", "ops-replay", orig("mallory"), "mallory",
			`first published by "mallory" (replayed by "ops-replay")`},
		{"replayed, no first producer", "ops-replay", amqp.Table{"x-other": "y"}, "", `replayed by "ops-replay" with no x-original-user-id`},
		{"replayed, header not a string", "ops-replay", amqp.Table{dlq.HeaderOriginalUser: []byte("payments-api")}, "",
			`replayed by "ops-replay" with no x-original-user-id`},
		{"the replaying user is no producer", "ops-replay", nil, "", "first producer is unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := p.Admit(tt.userID, tt.headers)
			if tt.headers != nil && reflect.ValueOf(got).Pointer() != reflect.ValueOf(tt.headers).Pointer() {
				t.Errorf("Admit copied the delivery's headers instead of stamping them")
			}
			if s, _ := got[dlq.HeaderOriginalUser].(string); s != tt.producer {
				t.Errorf("x-original-user-id = %q, want %q", s, tt.producer)
			}
			if _, has := got[dlq.HeaderOriginalUser]; has && tt.producer == "" {
				t.Errorf("x-original-user-id kept as %v for no producer", got[dlq.HeaderOriginalUser])
			}
			if tt.headers["x-other"] != nil && got["x-other"] != tt.headers["x-other"] {
				t.Errorf("other headers lost: %v", got)
			}
			if tt.reason == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if c := event.ClassOf(context.Background(), err); c != event.ClassUnauthorized {
				t.Fatalf("class %q (%v), want unauthorized", c, err)
			}
			if !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("reason %q, want it to say %q", err, tt.reason)
			}
			if decide(event.ClassOf(context.Background(), err)) != ActionDeadLetter {
				t.Error("an unauthorized message is not dead-lettered")
			}
		})
	}
}

// With PRODUCERS empty, and with no list at all, every publisher passes, as
// before the list existed; the producer is still stamped, so that letters
// keep it for the day PRODUCERS is set.
func TestProducersEmptyAcceptsAny(t *testing.T) {
	empty, err := NewProducers("", "ops-replay")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*Producers{empty, nil} {
		if !p.AcceptsAny() {
			t.Errorf("%v does not accept any publisher", p)
		}
		for _, u := range []string{"", "anyone", "ops-replay"} {
			if _, err := p.Admit(u, amqp.Table{dlq.HeaderOriginalUser: "x"}); err != nil {
				t.Errorf("user_id %q refused: %v", u, err)
			}
		}
		h, _ := p.Admit("anyone", amqp.Table{dlq.HeaderOriginalUser: "forged"})
		if h[dlq.HeaderOriginalUser] != "anyone" {
			t.Errorf("stamped %v, want the user_id", h[dlq.HeaderOriginalUser])
		}
	}
	h, _ := empty.Admit("ops-replay", amqp.Table{dlq.HeaderOriginalUser: "payments-api"})
	if h[dlq.HeaderOriginalUser] != "payments-api" {
		t.Errorf("a replay's first producer not kept: %v", h)
	}
}

// A user cannot both produce and replay: its own events would pass as
// replays naming any producer.
func TestProducersRefusesAUserInBothLists(t *testing.T) {
	if _, err := NewProducers("payments-api,ops", " ops "); err == nil || !strings.Contains(err.Error(), `"ops"`) {
		t.Errorf("err = %v, want the user named", err)
	}
}

// What judging and stamping a delivery's producer costs, as a producer on
// the list publishes (user_id set, two headers of its own).
func BenchmarkAdmit(b *testing.B) {
	p, err := NewProducers("payments-api", "ops-replay")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		headers := amqp.Table{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x-source": "api"}
		if _, err := p.Admit("payments-api", headers); err != nil {
			b.Fatal(err)
		}
	}
}
