package dlq

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The fuzz targets take headers as JSON, so that their seeds read as the
// headers they are: an object is a table, an array an array, a whole number
// an int64 and another a float64, and an object with a single key of these
// a value of another AMQP type: {"$time": seconds}, {"$int32": n},
// {"$int16": n}, {"$bytes": "text"}, {"$float": n} (n may be "NaN" or
// "+Inf"), {"$decimal": n}.
func headersFrom(data []byte) (amqp.Table, bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return nil, false
	}
	t, ok := amqpValue(v, 0).(amqp.Table)
	return t, ok
}

func amqpValue(v any, depth int) any {
	switch v := v.(type) {
	case json.Number:
		if i, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			return i
		}
		f, _ := strconv.ParseFloat(string(v), 64)
		return f
	case []any:
		out := make([]any, 0, len(v))
		for _, x := range v {
			out = append(out, amqpValue(x, depth+1))
		}
		return out
	case map[string]any:
		if len(v) == 1 {
			for k, x := range v {
				n, _ := x.(json.Number)
				if str, ok := x.(string); ok { // "NaN", "+Inf", "-Inf" as {"$float": "NaN"}
					n = json.Number(str)
				}
				i, _ := strconv.ParseInt(string(n), 10, 64)
				f, _ := strconv.ParseFloat(string(n), 64)
				switch k {
				case "$time":
					return time.Unix(i, 0)
				case "$int32":
					return int32(i)
				case "$int16":
					return int16(i)
				case "$float":
					return f
				case "$decimal":
					return amqp.Decimal{Scale: 2, Value: int32(i)}
				case "$bytes":
					s, _ := x.(string)
					return []byte(s)
				}
			}
		}
		t := amqp.Table{}
		for k, x := range v {
			t[k] = amqpValue(x, depth+1)
		}
		return t
	}
	return v // string, bool, nil
}

// headerSeeds are headers as each writer of dead letters leaves them: the
// service's copy, the broker's own dead letters (3.10's and 4.x's x-death),
// a replayed letter that failed again, and some of the wrong types.
var headerSeeds = []string{
	`{}`,
	`{"x-failure-class":"poison","x-failure-reason":"body is not a JSON event","x-failed-at":"2026-07-10T12:00:00.123456789Z",
	  "x-failed-by":"svc-1","x-original-queue":"transfers.3","x-original-exchange":"transfers","x-original-routing-key":"acc_1",
	  "x-original-delivery-count":0,"x-original-user-id":"payments-api"}`,
	`{"x-failure-class":"unauthorized","x-failure-reason":"user_id \"mallory\" is not in PRODUCERS","x-original-user-id":"mallory",
	  "x-failed-at":"2026-07-10T12:00:00Z","x-replay-run":"abc","x-replayed-at":"2026-07-09T12:00:00Z"}`,
	`{"x-death":[{"count":11,"reason":"delivery_limit","queue":"transfers.0","time":{"$time":1783684800},"exchange":"transfers",
	  "routing-keys":["acc_1"]}],"x-first-death-exchange":"transfers","x-first-death-queue":"transfers.0","x-first-death-reason":"delivery_limit"}`,
	`{"x-death":[{"count":1,"reason":"rejected","queue":"transfers.1","time":{"$time":1783684800},"routing-keys":["acc_2"]},
	  {"count":2,"reason":"delivery_limit","queue":"transfers.1","time":{"$time":1783600000}}],
	  "x-last-death-reason":"rejected","x-original-user-id":"payments-api","x-replayed-at":"2026-07-11T00:00:00Z"}`,
	`{"x-failure-class":42,"x-death":"not an array","x-failed-at":"yesterday","x-delivery-count":{"$int32":3}}`,
	`{"x-death":[17,{"time":"2026-01-01T00:00:00Z","count":{"$int32":1},"routing-keys":[5]}],"x-delivery-count":-4}`,
	`{"x-death":[{"reason":{"$bytes":"rejected"},"queue":null,"count":{"$float":1.5}}],"x-original-user-id":{"$bytes":"x"}}`,
}

// Whatever headers a dead letter carries, Describe says what they say and
// nothing else, the earliest time it shows is its DeadSince, the filters
// agree with the letter, and its first producer is never one a header
// claims for a message the broker dead-lettered from someone else; the
// service's copy of it keeps its failure and claims no producer it was not
// given.
func FuzzDescribe(f *testing.F) {
	for i, h := range headerSeeds {
		users := []string{"", "payments-api", "mallory", "ops-replay"}
		f.Add([]byte(h), users[i%len(users)], []byte(`{"eventId":"3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10"}`), "")
	}
	f.Add([]byte(headerSeeds[4]), "ops-replay", []byte("hello"), "e1")
	f.Fuzz(func(t *testing.T, headersJSON []byte, userID string, body []byte, messageID string) {
		headers, ok := headersFrom(headersJSON)
		if !ok {
			return
		}
		d := amqp.Delivery{Headers: headers, UserId: userID, Body: body, MessageId: messageID, RoutingKey: "acc_k"}
		l := Describe(d)
		checkClass(t, d, l)
		checkDeadSince(t, headers, l.DeadSince)
		if !(Filter{}).Match(l) || !(Filter{Class: l.Class, EventID: l.EventID, Reason: l.Reason}).Match(l) {
			t.Fatalf("the filters that name %+v do not match it", l)
		}
		if !l.since().IsZero() && (Filter{FailedAfter: l.since()}).Match(l) {
			t.Fatalf("%+v matches a filter of letters after its own time", l)
		}
		if n, want := DeliveryCount(headers), wantCount(headers["x-delivery-count"]); n != want {
			t.Fatalf("DeliveryCount %d, want %d", n, want)
		}
		checkProducer(t, d)

		c := Copy(d, Failure{Class: "unauthorized", Reason: strings.Repeat("r", 3000), Queue: "transfers.2", At: time.Unix(1, 0)})
		copied := Describe(amqp.Delivery{Headers: c.Headers, Body: c.Body, MessageId: c.MessageId, UserId: c.UserId})
		if copied.Class != "unauthorized" || copied.Queue != "transfers.2" || len(copied.Reason) > maxReason+len("…") ||
			c.UserId != "" || DeliveryCount(c.Headers) != 0 {
			t.Fatalf("the copy reads as %+v, user_id %q", copied, c.UserId)
		}
		claim, _ := headers[HeaderOriginalUser].(string)
		if p := LetterProducer(amqp.Delivery{Headers: c.Headers}, func(string) bool { return true }); p != "" && p != claim {
			t.Fatalf("the copy names producer %q, its delivery %q", p, claim)
		}
	})
}

func checkClass(t *testing.T, d amqp.Delivery, l Letter) {
	class, isString := d.Headers[HeaderClass].(string)
	deaths, _ := d.Headers["x-death"].([]any)
	switch {
	case isString:
		reason, _ := d.Headers[HeaderReason].(string)
		if l.Class != class || l.Reason != reason {
			t.Fatalf("class %q and reason %q read as %+v", class, reason, l)
		}
	case len(deaths) > 0:
		if _, ok := deaths[0].(amqp.Table); ok != strings.HasPrefix(l.Reason, "dead-lettered by the broker") {
			t.Fatalf("x-death %v read as %+v", deaths, l)
		}
	default:
		if l.Class != "unknown" {
			t.Fatalf("no failure headers, class %q", l.Class)
		}
	}
	if l.EventID == "" && d.MessageId != "" {
		t.Fatalf("message_id %q not the event id", d.MessageId)
	}
}

// checkDeadSince checks DeadSince against the times the headers show.
func checkDeadSince(t *testing.T, headers amqp.Table, got time.Time) {
	var times []time.Time
	for _, k := range []string{HeaderFailedAt, HeaderReplayedAt} {
		if s, ok := headers[k].(string); ok {
			if at, err := time.Parse(time.RFC3339Nano, s); err == nil && !at.IsZero() {
				times = append(times, at)
			}
		}
	}
	deaths, _ := headers["x-death"].([]any)
	for _, x := range deaths {
		if death, ok := x.(amqp.Table); ok {
			if at, ok := death["time"].(time.Time); ok && !at.IsZero() {
				times = append(times, at)
			}
		}
	}
	if len(times) == 0 {
		if !got.IsZero() {
			t.Fatalf("DeadSince %v from headers that show no time", got)
		}
		return
	}
	shown := false
	for _, at := range times {
		shown = shown || at.Equal(got)
		if at.Before(got) {
			t.Fatalf("DeadSince %v, yet the headers show %v", got, at)
		}
	}
	if !shown {
		t.Fatalf("DeadSince %v is none of %v", got, times)
	}
}

func wantCount(v any) int64 {
	switch v := v.(type) {
	case int64:
		return v
	case int32:
		return int64(v)
	}
	return 0
}

// checkProducer: a letter the broker dead-lettered names its user_id as
// producer, unless that user replays, whose header it then names.
func checkProducer(t *testing.T, d amqp.Delivery) {
	replayer := func(u string) bool { return u == "ops-replay" }
	p := LetterProducer(d, replayer)
	claim, _ := d.Headers[HeaderOriginalUser].(string)
	deaths, _ := d.Headers["x-death"].([]any)
	switch {
	case len(deaths) == 0:
		if p != claim {
			t.Fatalf("the service's copy names %q, its header %q", p, claim)
		}
	case d.UserId == "ops-replay":
		if p != claim {
			t.Fatalf("a replayed letter names %q, its header %q", p, claim)
		}
	case p != d.UserId:
		t.Fatalf("a letter the broker dead-lettered from %q names %q", d.UserId, p)
	}
}

// What Lines writes for a letter, ReadRecords reads back equal: every
// property, the body byte for byte, the headers but for the types JSON does
// not keep (a whole float comes back an int64). Strings are taken as UTF-8,
// as JSON has them (see the note in FuzzRecordsReadAnything).
func FuzzRecordRoundTrip(f *testing.F) {
	for i, h := range headerSeeds {
		f.Add([]byte(h), []byte(`{"eventId":"e"}`), "e", "payments-api", "acc_1", int64(1783684800+i), uint8(i))
	}
	f.Add([]byte(`{"n":1e300,"f":0.1,"big":{"$float":1e18},"nested":{"a":[true,null,"x"]}}`), []byte{0xff, 0, '\n'}, "", "", "", int64(-62135596800), uint8(2))
	f.Add([]byte(`{}`), []byte{}, "", "", "", int64(0), uint8(0))
	f.Fuzz(func(t *testing.T, headersJSON, body []byte, messageID, userID, key string, ts int64, mode uint8) {
		headers, ok := headersFrom(headersJSON)
		if !ok {
			return
		}
		d := amqp.Delivery{Headers: headers, Body: body, MessageId: messageID, UserId: userID, RoutingKey: key,
			Exchange: "transfers.dlx", DeliveryMode: mode % 3, Priority: mode / 3, ContentType: "application/json"}
		if ts != 0 {
			d.Timestamp = time.Unix(ts, 0)
		}
		at := time.Unix(1783684800, 5).UTC()
		var out bytes.Buffer
		l := Describe(d)
		// Any letter the broker can deliver is recorded: one that is not
		// would stop every drop at it, and stay in the DLQ for ever.
		if err := (Lines{W: &out, Queue: "transfers.dlq", Now: func() time.Time { return at }}).Record(d, l); err != nil {
			t.Fatalf("a letter could not be recorded: %v", err)
		}
		records, err := ReadRecords(&out)
		if err != nil || len(records) != 1 {
			t.Fatalf("%d records read back, %v", len(records), err)
		}
		// Each string on its own: two halves of a character that are not
		// UTF-8 apart make one that is (the first failure this target found).
		if !jsonKeeps(headers) || !utf8.ValidString(messageID) || !utf8.ValidString(userID) || !utf8.ValidString(key) {
			return // recorded, yet not as it was: see NewRecord
		}
		got, want := records[0], NewRecord(d, l, "transfers.dlq", at)
		if !sameRecord(got, want) {
			t.Fatalf("read back %+v\nwrote %+v", got, want)
		}
		back := got.Delivery()
		if !bytes.Equal(back.Body, d.Body) || back.UserId != d.UserId || !back.Timestamp.Equal(d.Timestamp) ||
			LetterProducer(back, nil) != LetterProducer(d, nil) {
			t.Fatalf("the delivery read back %+v is not the letter %+v", back, d)
		}
	})
}

// jsonKeeps reports whether JSON can carry v, and ReadRecords give it back
// as a value equal to it: no bytes, times, decimals or small integer types
// (they come back as strings, objects or int64s, as documented), no string
// that is not UTF-8, no NaN.
func jsonKeeps(v any) bool {
	switch v := v.(type) {
	case string:
		return utf8.ValidString(v)
	case int64, bool, nil:
		return true
	case float64:
		return !math.IsNaN(v) && !math.IsInf(v, 0)
	case []any:
		for _, x := range v {
			if !jsonKeeps(x) {
				return false
			}
		}
		return true
	case amqp.Table:
		for k, x := range v {
			if !utf8.ValidString(k) || !jsonKeeps(x) {
				return false
			}
		}
		return true
	}
	return false
}

func sameRecord(a, b Record) bool {
	sameTime := (a.Timestamp == nil) == (b.Timestamp == nil) && (a.Timestamp == nil || a.Timestamp.Equal(*b.Timestamp))
	a.Timestamp, b.Timestamp = nil, nil
	headersA, headersB := a.Headers, b.Headers
	a.Headers, b.Headers = nil, nil
	bodyA, bodyB := a.Body, b.Body
	a.Body, b.Body = nil, nil
	dropped := a.DroppedAt.Equal(b.DroppedAt)
	a.DroppedAt, b.DroppedAt = time.Time{}, time.Time{}
	return sameTime && dropped && reflect.DeepEqual(a, b) && bytes.Equal(bodyA, bodyB) && sameJSON(headersA, headersB)
}

// sameJSON compares header values as JSON numbers do: by value.
func sameJSON(a, b any) bool {
	switch x := a.(type) {
	case amqp.Table:
		y, ok := b.(amqp.Table)
		if !ok || len(x) != len(y) {
			return false
		}
		for k := range x {
			if !sameJSON(x[k], y[k]) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !sameJSON(x[i], y[i]) {
				return false
			}
		}
		return true
	case int64:
		if f, ok := b.(float64); ok {
			return float64(x) == f
		}
	case float64:
		if i, ok := b.(int64); ok {
			return x == float64(i)
		}
	}
	return a == b
}

// Any text read as a record file reads without a panic, and what it reads
// writes back to the same records: reading is a fixed point. Strings that
// are not UTF-8 come back with U+FFFD in place of the bad bytes (JSON's
// rule), which is why FuzzRecordRoundTrip takes UTF-8 only.
func FuzzRecordsReadAnything(f *testing.F) {
	f.Add([]byte(`{"droppedAt":"2026-07-10T12:00:00Z","queue":"transfers.dlq","class":"poison","exchange":"transfers.dlx","routingKey":"acc_1","headers":{"x-death":[{"count":3}]},"body":"aGVsbG8=","bodyText":"hello"}` + "\n"))
	f.Add([]byte("{}\n\n{\"headers\":null,\"body\":null}\n"))
	f.Add([]byte(`{"headers":{"n":1e999}}`))
	f.Add([]byte(`{"timestamp":"10000-01-01T00:00:00Z"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		records, err := ReadRecords(bytes.NewReader(data))
		if err == nil && len(records) > bytes.Count(data, []byte("\n"))+1 {
			t.Fatalf("%d records from %d lines", len(records), bytes.Count(data, []byte("\n"))+1)
		}
		var out bytes.Buffer
		for _, r := range records {
			line, err := json.Marshal(r)
			if err != nil {
				return // a time JSON cannot write (year 10000): read, yet not written again
			}
			out.Write(append(line, '\n'))
		}
		again, err := ReadRecords(&out)
		if err != nil || len(again) != len(records) {
			t.Fatalf("what was read does not read back: %d of %d, %v", len(again), len(records), err)
		}
		for i := range again {
			if !sameRecord(again[i], records[i]) {
				t.Fatalf("record %d read back as %+v, was %+v", i, again[i], records[i])
			}
		}
	})
}
