package consumer

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
	"transferconsumer/event"
)

// A publisher is admitted exactly when its first producer is listed, the
// producer named in the headers every dead letter of it carries.
func FuzzAdmit(f *testing.F) {
	for _, u := range []string{"payments-api", "", "mallory", "ops-replay"} {
		f.Add(u, "", uint8(0))
	}
	f.Add("ops-replay", "payments-api", uint8(1))
	f.Add("ops-replay", "mallory", uint8(1))
	f.Add("mallory", "payments-api", uint8(1))
	f.Add("", "payments-api", uint8(1))
	f.Add("ops-replay", "payments-api", uint8(2))

	producers, err := NewProducers("payments-api,ledger-import", "ops-replay")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, userID, original string, shape uint8) {
		checkAdmit(t, producers, userID, original, shape)
	})
}

// checkAdmit judges userID with x-original-user-id set, by shape, to
// original as a string (1), as bytes (2), or not at all (0, and any other).
func checkAdmit(t *testing.T, p *Producers, userID, original string, shape uint8) {
	headers := amqp.Table{"x-other": "kept"}
	switch shape % 3 {
	case 1:
		headers[dlq.HeaderOriginalUser] = original
	case 2:
		headers[dlq.HeaderOriginalUser] = []byte(original)
	}
	before := headers[dlq.HeaderOriginalUser]
	out, err := p.Admit(userID, headers)
	if len(out) != len(headers) || !sameValue(out[dlq.HeaderOriginalUser], headers[dlq.HeaderOriginalUser]) {
		t.Fatalf("Admit returned %v, not the delivery's own headers stamped (%v)", out, headers)
	}
	// The first producer, by the rule of adr/0008.
	want := userID
	if userID == "ops-replay" {
		want = ""
		if shape%3 == 1 {
			want = original
		}
	}
	stamped, isString := out[dlq.HeaderOriginalUser].(string)
	if _, has := out[dlq.HeaderOriginalUser]; (want == "" && has) || (want != "" && (!isString || stamped != want)) {
		t.Fatalf("user_id %q, header %v: stamped %v, want %q", userID, before, out[dlq.HeaderOriginalUser], want)
	}
	if out["x-other"] != "kept" {
		t.Fatalf("other headers lost: %v", out)
	}
	listed := want == "payments-api" || want == "ledger-import"
	if listed != (err == nil) {
		t.Fatalf("user_id %q, header %v: first producer %q admitted %v", userID, before, want, err == nil)
	}
	if err == nil {
		return
	}
	if c := event.ClassOf(context.Background(), err); c != event.ClassUnauthorized || decide(c) != ActionDeadLetter {
		t.Fatalf("refusal of class %q: %v", c, err)
	}
	named := strings.Contains(err.Error(), event.Quote(want))
	if want == "" {
		named = strings.Contains(err.Error(), "no user_id") || strings.Contains(err.Error(), "first producer is unknown")
	}
	if !named || !utf8.ValidString(err.Error()) || len(err.Error()) > 512 {
		t.Fatalf("reason %q does not name %q, or is not a bounded text", err, want)
	}
}

func sameValue(a, b any) bool {
	ab, aok := a.([]byte)
	bb, bok := b.([]byte)
	if aok || bok {
		return aok && bok && bytes.Equal(ab, bb)
	}
	return a == b
}
