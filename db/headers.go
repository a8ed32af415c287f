package db

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// wrappedHeadersKey is the one key of a header object that jsonb could not
// keep as it was: the JSON text event.HeadersJSON wrote, as a string
// under this key.
const wrappedHeadersKey = "transferconsumer:headers-json"

// storableHeaders returns the JSON of a message's headers in a form a jsonb
// column keeps. jsonb refuses \u0000 in a string (SQLSTATE 22P05), and a
// header's content must never make a valid event a dead letter: headers with
// a NUL, in a value or a key, are kept whole as their JSON text, a string in
// which the NUL is plain text, under wrappedHeadersKey. Headers that already
// use that key are wrapped too, so that reading them back is never
// ambiguous. Others are kept as they are, so that a person can query them.
func storableHeaders(b []byte) []byte {
	if !bytes.Contains(b, []byte(`\u0000`)) && !bytes.Contains(b, []byte(wrappedHeadersKey)) {
		return b
	}
	wrapped, err := json.Marshal(map[string]string{wrappedHeadersKey: string(b)})
	if err != nil {
		return nil // a string always marshals
	}
	return wrapped
}

// loadedHeaders is the way back from storableHeaders: the JSON text the
// headers had before they were stored.
func loadedHeaders(b []byte) []byte {
	if !bytes.Contains(b, []byte(wrappedHeadersKey)) {
		return b
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(b, &obj) != nil || len(obj) != 1 {
		return b
	}
	var text string
	if raw, ok := obj[wrappedHeadersKey]; !ok || json.Unmarshal(raw, &text) != nil {
		return b
	}
	return []byte(text)
}

// storableText returns s as a text column keeps it: without NUL, and with
// bytes that are not UTF-8 replaced by U+FFFD (SQLSTATE 22021 otherwise).
// The routing key and content type of a message are kept so: short strings
// that a producer may fill with anything, which must not make a valid event
// a dead letter either.
func storableText(s string) string {
	if strings.IndexByte(s, 0) < 0 && utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
}
