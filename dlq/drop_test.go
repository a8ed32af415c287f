package dlq

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// A record holds the body byte for byte, even when it is not text, the
// headers and the properties; each is one line.
func TestLinesRecordsTheWholeLetter(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	letters := []amqp.Delivery{
		{Body: []byte(`{"eventId":"e1"}`), MessageId: "e1", RoutingKey: "acc_1", Exchange: "transfers.dlx",
			ContentType: "application/json", Timestamp: at, DeliveryMode: amqp.Persistent,
			Headers: amqp.Table{HeaderClass: "poison", HeaderReason: "bad", "x-n": int64(3)}},
		{Body: []byte{0xff, 0x00, '\n', 0xfe}, RoutingKey: "acc_2"},
	}
	var out bytes.Buffer
	w := Lines{W: &out, Queue: "transfers.dlq", Now: func() time.Time { return at }}
	for _, d := range letters {
		if err := w.Record(d, Describe(d)); err != nil {
			t.Fatal(err)
		}
	}
	lines := bytes.Split(bytes.TrimSuffix(out.Bytes(), []byte("\n")), []byte("\n"))
	if len(lines) != len(letters) {
		t.Fatalf("%d lines for %d letters:\n%s", len(lines), len(letters), out.String())
	}
	records, err := ReadRecords(bytes.NewReader(out.Bytes()))
	if err != nil || len(records) != len(letters) {
		t.Fatalf("read back %d records, %v", len(records), err)
	}
	for i, r := range records {
		d := letters[i]
		if !bytes.Equal(r.Body, d.Body) || r.RoutingKey != d.RoutingKey || r.MessageID != d.MessageId ||
			r.Queue != "transfers.dlq" || !r.DroppedAt.Equal(at) {
			t.Errorf("line %d = %+v, want letter %+v", i, r, d)
		}
	}
	first := records[0]
	if first.Class != "poison" || first.Headers["x-n"] != int64(3) || first.ContentType != "application/json" ||
		first.Timestamp == nil || !first.Timestamp.Equal(at) || first.BodyText != `{"eventId":"e1"}` || first.EventID != "e1" {
		t.Errorf("first record = %+v", first)
	}
	second := records[1]
	if second.BodyText != "" || second.Timestamp != nil || second.Class != "unknown" {
		t.Errorf("second record = %+v: no text for a body that is not UTF-8, no timestamp when there was none", second)
	}
}

// A record that cannot be written whole fails, and leaves a file as it was.
func TestLinesFailsAndLeavesTheFileWhole(t *testing.T) {
	name := filepath.Join(t.TempDir(), "r.jsonl")
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	w := Lines{W: f, Queue: "transfers.dlq"}
	d := amqp.Delivery{Body: []byte("hello")}
	if err := w.Record(d, Describe(d)); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(name)
	bad := amqp.Delivery{Body: []byte("x"), Headers: amqp.Table{"x-f": func() {}}} // not encodable
	if err := w.Record(bad, Describe(bad)); err == nil {
		t.Error("a record that cannot be encoded was taken")
	}
	f.Close()
	if err := w.Record(d, Describe(d)); err == nil || !errors.Is(err, os.ErrClosed) {
		t.Errorf("a write to a closed file: %v", err)
	}
	after, _ := os.ReadFile(name)
	if !bytes.Equal(before, after) {
		t.Errorf("the file changed:\n%s\nthen\n%s", before, after)
	}
}

// An unfiltered replay leaves alone the classes that cannot apply again and
// counts them; naming the class replays them.
func TestReplayLeavesAloneWhatCannotApplyAgain(t *testing.T) {
	now := time.Now().UTC().Format(time.RFC3339Nano)
	letter := func(class string) amqp.Delivery {
		return amqp.Delivery{Headers: amqp.Table{HeaderClass: class, HeaderFailedAt: now}}
	}
	tests := []struct {
		class  string
		filter Filter
		replay bool
	}{
		{"poison", Filter{}, false},
		{"producer-conflict", Filter{}, false},
		{"poison", Filter{Class: "poison"}, true},
		{"producer-conflict", Filter{Class: "producer-conflict"}, true},
		{"poison", Filter{Reason: "x"}, false},
		{"data-rejected", Filter{}, true},
		{"invalid-transition", Filter{}, true},
		{"panic", Filter{}, true},
		{"delivery_limit", Filter{}, true},
		{"poison", Filter{Class: "panic"}, false},
		{"unauthorized", Filter{}, false},
		{"unauthorized", Filter{Class: "unauthorized"}, true},
	}
	for _, tt := range tests {
		r := ReplayReport{Run: "run"}
		d := letter(tt.class)
		tt.filter.FailedAfter = time.Now().Add(-time.Hour)
		if got := r.shouldReplay(d, Describe(d), tt.filter); got != tt.replay {
			t.Errorf("%s with %+v: replay %v, want %v", tt.class, tt.filter, got, tt.replay)
		}
		counted := r.Unreplayable[tt.class] == 1
		wantCounted := !tt.replay && tt.filter.Class == "" && tt.filter.Reason == ""
		if counted != wantCounted {
			t.Errorf("%s with %+v: counted as left alone %v, want %v", tt.class, tt.filter, counted, wantCounted)
		}
	}
}
