package dlq

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Reasons as the service writes them, two of each failure that differ only
// in what the message brought: event.Decode's (poison), apply_effect.sql's
// (invalid-transition), db.result's (producer-conflict), consumer's
// producer check (unauthorized), the panic recovery, and Describe's for the
// broker's own dead letters.
var sameFailures = []struct {
	class, a, b string
}{
	{"poison", `data.amountMinor 0 is not positive`, `data.amountMinor -250 is not positive`},
	{"poison", `data.currency "eur" is not three upper-case letters`, `data.currency "usd" is not three upper-case letters`},
	{"poison", `eventId "not-a-uuid" is not a UUID`, `eventId "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"… (120 bytes) is not a UUID`},
	{"poison", `message_id "3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10" does not match eventId "0c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33"`,
		`message_id "a" does not match eventId "b"`},
	{"poison", `occurredAt "yesterday" is not an RFC 3339 time`, `occurredAt "2026-13-01" is not an RFC 3339 time`},
	{"invalid-transition",
		`TransferCompleted for transfer 0c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33, which is already failed`,
		`TransferCompleted for transfer 7d1e2f3a-0000-4b5c-8d9e-112233445566, which is already failed`},
	// As the service writes it: db wraps the database's reason with the
	// event's id.
	{"invalid-transition",
		`apply event 3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10: TransferCompleted for transfer 0c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33, which is already failed`,
		`apply event 11111111-2222-4333-8444-555555555555: TransferCompleted for transfer 7d1e2f3a-0000-4b5c-8d9e-112233445566, which is already failed`},
	{"invalid-transition",
		`TransferFailed for transfer 0c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33 carries acc_00001→acc_00002 10000 EUR, the transfer is acc_00001→acc_00003 10000 EUR`,
		`TransferFailed for transfer 7d1e2f3a-0000-4b5c-8d9e-112233445566 carries a→b 5 USD, the transfer is a→b 7 USD`},
	{"invalid-transition",
		`TransferCreated for transfer 0c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33 contradicts the TransferFailed waiting for its creation`,
		`TransferCreated for transfer 7d1e2f3a-0000-4b5c-8d9e-112233445566 contradicts the TransferFailed waiting for its creation`},
	{"invalid-transition",
		`transfer 0c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33 was already created by event 3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10`,
		`transfer 7d1e2f3a-0000-4b5c-8d9e-112233445566 was already created by event 11111111-2222-4333-8444-555555555555`},
	{"producer-conflict",
		`producer conflict: event 3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10 was applied with content fingerprint 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08, this delivery has 60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752`,
		`producer conflict: event 11111111-2222-4333-8444-555555555555 was applied with content fingerprint 2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae, this delivery has fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9`},
	{"unauthorized", `user_id "mallory" is not in PRODUCERS`, `user_id "eve" is not in PRODUCERS`},
	{"data-rejected",
		`the database refused the event's data: pq: value "99999999999999999999" is out of range for type bigint`,
		`the database refused the event's data: pq: value "123456789012345678901" is out of range for type bigint`},
	{"panic", `panic: runtime error: index out of range [3] with length 3`, `panic: runtime error: index out of range [7] with length 2`},
	{"panic", `panic: invalid memory address 0xc000123456`, `panic: invalid memory address 0x0`},
	{"delivery_limit", `dead-lettered by the broker (delivery_limit) from transfers.3, 1 time(s)`,
		`dead-lettered by the broker (delivery_limit) from transfers.0, 2 time(s)`},
}

func TestFingerprintGroupsFailuresThatDifferOnlyInTheirValues(t *testing.T) {
	// A long number is a number, not a hex string.
	if Fingerprint("poison", `data.amountMinor -9223372036854775808 is not positive`) != Fingerprint("poison", `data.amountMinor 0 is not positive`) {
		t.Error("the least int64 amount and a zero amount: two groups, want one")
	}
	for _, c := range sameFailures {
		if fa, fb := Fingerprint(c.class, c.a), Fingerprint(c.class, c.b); fa != fb {
			t.Errorf("%s: %q and %q: %s and %s, want one group (templates %q, %q)",
				c.class, c.a, c.b, fa, fb, Template(c.a), Template(c.b))
		}
	}
}

func TestFingerprintSeparatesDifferentFailures(t *testing.T) {
	seen := map[string]string{}
	for _, c := range sameFailures {
		f := Fingerprint(c.class, c.a)
		if other, ok := seen[f]; ok {
			t.Errorf("%s %q and %s: one group %s, want two", c.class, c.a, other, f)
		}
		seen[f] = c.class + " " + c.a
	}
	// The same reason under another class is another failure.
	if Fingerprint("panic", "x") == Fingerprint("poison", "x") {
		t.Error("one reason under two classes: one group, want two")
	}
	// A transition contradicting a failed transfer and one contradicting a
	// completed one are two failures.
	failed := `TransferCompleted for transfer 0c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33, which is already failed`
	if Fingerprint("invalid-transition", failed) ==
		Fingerprint("invalid-transition", strings.Replace(failed, "already failed", "already completed", 1)) {
		t.Error("already failed and already completed: one group, want two")
	}
}

// TestFingerprintIsStable pins the fingerprint of real reasons: letters carry
// it and operators name groups by it across releases, so a change of
// Template or Fingerprint must be seen here, and weighed (adr/0015).
func TestFingerprintIsStable(t *testing.T) {
	for _, c := range []struct {
		class, reason, template, want string
	}{
		{"poison", `data.amountMinor 0 is not positive`, `data.amountMinor <n> is not positive`, "83461e1a2ae5"},
		{"poison", `data.currency "eur" is not three upper-case letters`, `data.currency <q> is not three upper-case letters`, "70a151dd571a"},
		{"invalid-transition", `TransferCompleted for transfer 0c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33, which is already failed`,
			`TransferCompleted for transfer <uuid>, which is already failed`, "5419d742573a"},
		{"invalid-transition", `apply event 3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10: TransferCompleted for transfer 0c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33, which is already failed`,
			`apply event <uuid>: TransferCompleted for transfer <uuid>, which is already failed`, "d1940939f5cf"},
		{"invalid-transition", `TransferFailed for transfer 0c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33 carries acc_00001→acc_00002 10000 EUR, the transfer is acc_00001→acc_00003 10000 EUR`,
			`TransferFailed for transfer <uuid> carries <a>→<a> <n> <cur>, the transfer is <a>→<a> <n> <cur>`, "d464ba914706"},
		{"producer-conflict", `producer conflict: event 3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10 was applied with content fingerprint 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08, this delivery has 60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752`,
			`producer conflict: event <uuid> was applied with content fingerprint <hex>, this delivery has <hex>`, "42290791c04c"},
		{"delivery_limit", `dead-lettered by the broker (delivery_limit) from transfers.3, 1 time(s)`,
			`dead-lettered by the broker (delivery_limit) from transfers.<n>, <n> time(s)`, "e50071a771eb"},
		{"panic", `panic: runtime error: index out of range [3] with length 3`, `panic: runtime error: index out of range [<n>] with length <n>`, "7ef9222e90f4"},
	} {
		if got := Template(c.reason); got != c.template {
			t.Errorf("Template(%q) = %q, want %q", c.reason, got, c.template)
		}
		if got := Fingerprint(c.class, c.reason); got != c.want {
			t.Errorf("Fingerprint(%q, %q) = %s, want %s", c.class, c.reason, got, c.want)
		}
	}
}

// The group goes into the letter's headers when it is dead-lettered, and the
// tools read it back; a letter without it (the broker's, or one from a
// release before the header) gets the same fingerprint computed.
func TestLettersCarryTheirGroup(t *testing.T) {
	reason := `data.amountMinor 0 is not positive`
	d := amqp.Delivery{RoutingKey: "acc_1", Headers: amqp.Table{}}
	msg := Copy(d, Failure{Class: "poison", Reason: reason, Queue: "transfers.0", At: time.Now()})
	want := Fingerprint("poison", reason)
	if got := msg.Headers[HeaderGroup]; got != want {
		t.Errorf("Copy's %s = %v, want %s", HeaderGroup, got, want)
	}
	if got := Describe(amqp.Delivery{Headers: msg.Headers}).Group; got != want {
		t.Errorf("Describe's group of a copy = %s, want %s", got, want)
	}
	old := amqp.Table{}
	for k, v := range msg.Headers {
		old[k] = v
	}
	delete(old, HeaderGroup)
	if got := Describe(amqp.Delivery{Headers: old}).Group; got != want {
		t.Errorf("Describe's group of a letter without %s = %s, want %s", HeaderGroup, got, want)
	}
	broker := amqp.Table{"x-death": []interface{}{amqp.Table{"reason": "delivery_limit", "queue": "transfers.3", "count": int64(1)}}}
	if got, want := Describe(amqp.Delivery{Headers: broker}).Group,
		Fingerprint("delivery_limit", "dead-lettered by the broker (delivery_limit) from transfers.0, 4 time(s)"); got != want {
		t.Errorf("Describe's group of a broker's letter = %s, want %s", got, want)
	}
	// A replay takes the group off with the other failure headers: the
	// next failure is fingerprinted anew.
	if _, ok := replayHeaders(msg.Headers, "run", "", time.Now())[HeaderGroup]; ok {
		t.Errorf("replayHeaders kept %s", HeaderGroup)
	}
}

// Letters of one group count as one, with their first and last failure,
// their queues and how many were replayed before; --group selects one.
func TestGrouperGathersAGroup(t *testing.T) {
	at := time.Date(2026, 7, 10, 12, 0, 0, 0, time.UTC)
	var g grouper
	letters := []Letter{
		{Group: "a", Class: "poison", Reason: "first", Queue: "transfers.1", FailedAt: at.Add(time.Minute)},
		{Group: "b", Class: "panic", Reason: "other", Queue: "transfers.0", FailedAt: at},
		{Group: "a", Class: "poison", Reason: "second", Queue: "transfers.0", FailedAt: at, Replays: 2},
		{Group: "a", Class: "poison", Reason: "third", Queue: "transfers.1", FailedAt: at.Add(time.Hour)},
	}
	for _, l := range letters {
		g.add(l)
	}
	got := g.groups()
	if len(got) != 2 {
		t.Fatalf("groups %+v, want 2", got)
	}
	a := got[0]
	if a.Fingerprint != "a" || a.Count != 3 || a.Reason != "first" || !a.First.Equal(at) || !a.Last.Equal(at.Add(time.Hour)) ||
		strings.Join(a.Queues, ",") != "transfers.0,transfers.1" || a.Replayed != 1 {
		t.Errorf("group a = %+v", a)
	}
	if f := (Filter{Group: "a"}); !f.Match(letters[0]) || f.Match(letters[1]) {
		t.Error("Filter{Group: a} does not select group a alone")
	}
}

// Each replay adds one to x-replay-count and sets x-replayed-at; both
// survive the next dead-lettering (Copy keeps the delivery's headers), so a
// letter that fails after its third replay says 3.
func TestReplayHistorySurvivesTheNextDeadLettering(t *testing.T) {
	at := time.Date(2026, 7, 10, 12, 0, 0, 0, time.UTC)
	headers := amqp.Table{"traceparent": "00-abc"}
	for i := 1; i <= 3; i++ {
		headers = replayHeaders(headers, "run", "", at.Add(time.Duration(i)*time.Hour))
		msg := Copy(amqp.Delivery{Headers: headers}, Failure{Class: "panic", Reason: "panic: boom", At: at})
		headers = msg.Headers
		l := Describe(amqp.Delivery{Headers: headers})
		if l.Replays != int64(i) || !l.LastReplay.Equal(at.Add(time.Duration(i)*time.Hour)) {
			t.Errorf("after replay %d and a failure: %d replays, last %s", i, l.Replays, l.LastReplay)
		}
		if headers[HeaderReplayCount] != int64(i) {
			t.Errorf("after replay %d and a failure: %s = %v", i, HeaderReplayCount, headers[HeaderReplayCount])
		}
	}
	// Through the outbox's JSON a number may come back as a float64; a
	// letter replayed by a release before the count has x-replayed-at alone.
	if n := ReplayCount(amqp.Table{HeaderReplayCount: float64(4)}); n != 4 {
		t.Errorf("a float count: %d, want 4", n)
	}
	old := amqp.Table{HeaderReplayedAt: at.Format(time.RFC3339Nano)}
	if l := Describe(amqp.Delivery{Headers: old}); l.Replays != 1 {
		t.Errorf("x-replayed-at alone: %d replays, want 1", l.Replays)
	}
	if h := replayHeaders(old, "run", "", at); h[HeaderReplayCount] != int64(2) {
		t.Errorf("replaying a letter with x-replayed-at alone: count %v, want 2", h[HeaderReplayCount])
	}
}
