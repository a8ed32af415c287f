package dlq

import (
	"bytes"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A dropped letter read back from its record is described as it was
// before the drop, x-death and all, but for the time inside x-death, which
// JSON keeps as text.
func TestReadRecordsGivesBackTheLetter(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	letters := []amqp.Delivery{
		{Body: []byte(`{"eventId":"e1"}`), MessageId: "e1", RoutingKey: "acc_1", Exchange: "transfers.dlx", UserId: "payments-api",
			Headers: amqp.Table{HeaderClass: "unauthorized", HeaderReason: `user_id "x" is not in PRODUCERS`,
				HeaderFailedAt: at.Format(time.RFC3339Nano), HeaderOriginalQueue: "transfers.3", HeaderOriginalUser: "x"}},
		{Body: []byte{0xff, 0}, RoutingKey: "acc_2", UserId: "ledger-import", Timestamp: at,
			Headers: amqp.Table{"x-death": []interface{}{amqp.Table{"reason": "delivery_limit", "queue": "transfers.1",
				"count": int64(11), "routing-keys": []interface{}{"acc_2"}}}}},
	}
	var out bytes.Buffer
	w := Lines{W: &out, Queue: "transfers.dlq", Now: func() time.Time { return at }}
	for _, d := range letters {
		if err := w.Record(d, Describe(d)); err != nil {
			t.Fatal(err)
		}
	}
	out.WriteString("\n") // a blank line a person left
	records, err := ReadRecords(&out)
	if err != nil || len(records) != 2 {
		t.Fatalf("%d records, %v", len(records), err)
	}
	for i, r := range records {
		d := r.Delivery()
		got, want := Describe(d), Describe(letters[i])
		if got != want {
			t.Errorf("letter %d read back as %+v, want %+v", i, got, want)
		}
		if LetterProducer(d, nil) != LetterProducer(letters[i], nil) || !d.Timestamp.Equal(letters[i].Timestamp) {
			t.Errorf("letter %d: producer %q, timestamp %v", i, LetterProducer(d, nil), d.Timestamp)
		}
	}
}

// A line that is not a record stops the reading there, naming the line.
func TestReadRecordsNamesTheBadLine(t *testing.T) {
	good := `{"queue":"transfers.dlq","class":"poison","exchange":"","routingKey":"k","headers":{},"body":""}`
	for _, bad := range []string{`{"queue":`, `[]`, `null`, `{"headers":{"n":1e999}}`, `{} {}`, `{"body":"%%"}`} {
		records, err := ReadRecords(strings.NewReader(good + "\n" + bad + "\n" + good + "\n"))
		if err == nil || !strings.Contains(err.Error(), "line 2") || len(records) != 1 {
			t.Errorf("%s: %d records, %v; want the first and an error on line 2", bad, len(records), err)
		}
	}
	records, err := ReadRecords(strings.NewReader(good))
	if err != nil || len(records) != 1 || records[0].RoutingKey != "k" || records[0].Body == nil {
		t.Errorf("a last line without its newline: %+v, %v", records, err)
	}
}
