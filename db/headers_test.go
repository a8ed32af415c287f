package db

import (
	"bytes"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/event"
)

// Headers jsonb cannot keep go in and come back out as the same JSON text;
// others are kept as they are.
func TestStorableHeadersRoundTrip(t *testing.T) {
	for _, h := range []amqp.Table{
		{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
		{"x-note": "a\x00b"},
		{"k\x00ey": "v", "nested": amqp.Table{"n": "\x00", "list": []any{"x\x00", int64(3)}}},
		{"x-bytes": []byte("\x00\x01"), "plain": "\\u0000 as text"},
		{wrappedHeadersKey: "a producer's own header of that name"},
		{wrappedHeadersKey: `{"x": "y"}`},
	} {
		in := event.HeadersJSON(h)
		stored := storableHeaders(in)
		if bytes.Contains(stored, []byte(`\u0000`)) && !bytes.Contains(stored, []byte(`\\u0000`)) {
			t.Errorf("%q: stored %s still has a NUL", in, stored)
		}
		if !bytes.Contains(in, []byte(`\u0000`)) && !bytes.Contains(in, []byte(wrappedHeadersKey)) && !bytes.Equal(stored, in) {
			t.Errorf("%s: stored as %s, want it as it is", in, stored)
		}
		if out := loadedHeaders(stored); !bytes.Equal(out, in) {
			t.Errorf("%q: stored %s, read back %q", in, stored, out)
		}
	}
	if storableHeaders(nil) != nil {
		t.Error("no headers became some")
	}
}

func TestStorableText(t *testing.T) {
	for in, want := range map[string]string{
		"acc_00001":            "acc_00001",
		"application/\x00json": "application/json",
		"a\xffb":               "a\uFFFDb",
		"":                     "",
	} {
		if got := storableText(in); got != want {
			t.Errorf("storableText(%q) = %q, want %q", in, got, want)
		}
	}
}
