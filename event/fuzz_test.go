package event

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// poisonSeeds are the bodies the tests know to be poison, each kind once:
// the fuzzer starts from them and from the contract's sample.
func poisonSeeds() [][]byte {
	seeds := [][]byte{
		[]byte("hello"), nil, []byte("[]"), []byte(`{"eventId": 42}`),
		[]byte(`{"eventId": "not json`), []byte(`{"eventId": "not closed`),
		[]byte(`{"eventId":"3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10","eventType":"TransferCreated","occurredAt":"2026-07-10T12:00:00Z"}`),
		{0xff, 0xfe, '{', '}'},
	}
	for _, r := range [][]string{
		{`"eventId":"3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10",`, ""},
		{"3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10", "42"},
		{"TransferCreated", "TransferExploded"},
		{"2026-07-10T12:00:00Z", "yesterday"},
		{"0c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33", "t-1"},
		{`"fromAccount":"acc_00001"`, `"fromAccount":""`},
		{"acc_00002", strings.Repeat("a", 65)},
		{"acc_00002", `acc\u0007`},
		{"acc_00002", "acc_00001"},
		{"10000", "0"}, {"10000", "-5"}, {"10000", "100.5"}, {"10000", "1e4"}, {"10000", `"10000"`},
		{`"amountMinor":10000,`, ""}, {"10000", "99999999999999999999"},
		{"EUR", "eur"}, {"EUR", "EURO"},
		{`"currency":"EUR"`, `"currency":"EUR","note":"ignored"`},
		{"TransferCreated", "TransferCompleted"}, {"TransferCreated", "TransferFailed"},
	} {
		seeds = append(seeds, body(r...))
	}
	return seeds
}

// contractSample is the contract's sample event, the one every producer is
// shown.
func contractSample(f *testing.F) []byte {
	b, err := os.ReadFile("../integration/testdata/contract-sample.json")
	if err != nil {
		f.Fatal(err)
	}
	return bytes.TrimSpace(b)
}

// A delivery, whatever its body and properties, is either an event that
// holds the contract and reads back the same from its own canonical form,
// or poison with a bounded reason. (Whether its publisher is admitted is
// FuzzAdmit's, in the consumer.)
func FuzzDecode(f *testing.F) {
	sample := contractSample(f)
	for _, b := range append([][]byte{sample}, poisonSeeds()...) {
		f.Add(b, "", "")
	}
	f.Add(sample, "3F0B1F7E-8C1A-4A55-9A51-5B0A7C2F9D10", "TransferCreated")
	f.Add(sample, "0c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33", "")
	f.Add(sample, "", "TransferFailed")

	f.Fuzz(func(t *testing.T, body []byte, messageID, msgType string) {
		ev, err := Decode(body, messageID, msgType)
		if err != nil {
			checkPoison(t, err)
		} else {
			checkEvent(t, ev, messageID, msgType)
		}
	})
}

func checkPoison(t *testing.T, err error) {
	if c := ClassOf(context.Background(), err); c != ClassPoison {
		t.Fatalf("decode error of class %q: %v", c, err)
	}
	// Two quoted values of at most maxQuoted bytes each, escaped, and the
	// words around them: a reason fits a header frame.
	if n := len(err.Error()); n > 1024 {
		t.Fatalf("reason of %d bytes: %.200s…", n, err)
	}
}

func checkEvent(t *testing.T, ev Event, messageID, msgType string) {
	tr := ev.Transfer
	switch {
	case !IsUUID(ev.ID) || ev.ID != strings.ToLower(ev.ID), !IsUUID(tr.ID) || tr.ID != strings.ToLower(tr.ID):
		t.Fatalf("ids not canonical UUIDs: %+v", ev)
	case !knownType(ev.Type):
		t.Fatalf("unknown type %q decoded", ev.Type)
	case messageID != "" && !strings.EqualFold(messageID, ev.ID), msgType != "" && msgType != ev.Type:
		t.Fatalf("properties %q, %q disagree with %+v", messageID, msgType, ev)
	case tr.AmountMinor <= 0, !isCurrency(tr.Currency), tr.FromAccount == tr.ToAccount:
		t.Fatalf("invalid transfer decoded: %+v", tr)
	case checkAccount("from", tr.FromAccount) != nil, checkAccount("to", tr.ToAccount) != nil:
		t.Fatalf("invalid account decoded: %+v", tr)
	case ev.OccurredAt.Location() != time.UTC:
		t.Fatalf("occurredAt not in UTC: %v", ev.OccurredAt)
	case !bytes.Equal(ev.Fingerprint, fingerprint(ev)) || len(ev.Fingerprint) != 32:
		t.Fatalf("fingerprint %x is not the event's", ev.Fingerprint)
	}
	// The event written out canonically decodes to itself: nothing the
	// decoder kept depends on how the producer spelt it.
	canonical, err := json.Marshal(map[string]any{
		"eventId": ev.ID, "eventType": ev.Type, "occurredAt": ev.OccurredAt.Format(time.RFC3339Nano),
		"data": map[string]any{"transferId": tr.ID, "fromAccount": tr.FromAccount, "toAccount": tr.ToAccount,
			"amountMinor": json.RawMessage(strconv.FormatInt(tr.AmountMinor, 10)), "currency": tr.Currency},
	})
	if err != nil {
		t.Fatal(err)
	}
	again, err := Decode(canonical, ev.ID, ev.Type)
	if err != nil {
		t.Fatalf("the event's canonical form %s is refused: %v", canonical, err)
	}
	if again.ID != ev.ID || again.Type != ev.Type || !again.OccurredAt.Equal(ev.OccurredAt) ||
		again.Transfer != ev.Transfer || !bytes.Equal(again.Fingerprint, ev.Fingerprint) {
		t.Fatalf("decoded %+v, its canonical form %+v", ev, again)
	}
}
