package db

import (
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
)

// inlineCall writes the call fn(args...) into b, each argument a quoted
// literal, for a statement sent whole in one simple-protocol Query message
// (adr/0005, "One round trip"). Every literal is quoted, NULL aside, so
// PostgreSQL types each one from the function's parameters, as it types a
// parameter sent without a type: the same values reach the function either
// way (TestInlineLiteralsReachTheServerUnchanged).
//
// An argument is what a statement's parameter may be: a driver.Valuer (pq's
// arrays, sql.NullString), a pointer, or a string, []byte, integer or bool.
// Anything else is refused, never guessed at.
func inlineCall(b *strings.Builder, fn string, args []any) error {
	b.WriteString("SELECT ")
	b.WriteString(fn)
	b.WriteByte('(')
	for i, a := range args {
		if i > 0 {
			b.WriteString(", ")
		}
		if err := writeLiteral(b, a); err != nil {
			return fmt.Errorf("%s argument %d: %w", fn, i+1, err)
		}
	}
	b.WriteByte(')')
	return nil
}

// writeLiteral writes v as a literal. Text is quoted as pq.QuoteLiteral
// quotes it (writeText): the literal reads the same whatever
// standard_conforming_strings says. Bytes are written in bytea's hex form,
// in an escape string (E'\\x…'), which no byte of the data can end early.
// The kinds an event's call is made of are written without going through
// database/sql's converter and without a copy of the value (an attempt
// writes a dozen of them); the rest are converted first.
func writeLiteral(b *strings.Builder, v any) error {
	switch x := v.(type) {
	case string:
		writeText(b, x)
		return nil
	case sql.NullString:
		writeNullText(b, x)
		return nil
	case []byte:
		writeBytes(b, x)
		return nil
	}
	dv, err := driver.DefaultParameterConverter.ConvertValue(v)
	if err != nil {
		return err
	}
	switch x := dv.(type) {
	case nil:
		b.WriteString("NULL")
	case string:
		writeText(b, x)
	case []byte:
		writeBytes(b, x)
	case int64:
		writeInt(b, x)
	case bool:
		if x {
			b.WriteString("'true'")
		} else {
			b.WriteString("'false'")
		}
	default:
		return fmt.Errorf("a %T cannot be written as a literal", dv)
	}
	return nil
}

// writeInt writes n, quoted like every other literal.
func writeInt(b *strings.Builder, n int64) {
	var digits [24]byte
	b.WriteByte('\'')
	b.Write(strconv.AppendInt(digits[:0], n, 10))
	b.WriteByte('\'')
}

// writeNullText writes s's text, or NULL.
func writeNullText(b *strings.Builder, s sql.NullString) {
	if !s.Valid {
		b.WriteString("NULL")
		return
	}
	writeText(b, s.String)
}

// writeBytes writes p in bytea's hex form, or NULL for a nil p.
func writeBytes(b *strings.Builder, p []byte) {
	if p == nil {
		b.WriteString("NULL")
		return
	}
	b.WriteString(`E'\\x`)
	var chunk [128]byte
	for len(p) > 0 {
		n := min(len(p), len(chunk)/2)
		hex.Encode(chunk[:], p[:n])
		b.Write(chunk[:2*n])
		p = p[n:]
	}
	b.WriteByte('\'')
}

// writeText writes s quoted as pq.QuoteLiteral quotes it, with no copy of
// s: each quote doubled and, when s holds a backslash, each backslash
// doubled too, in an escape string (E'…').
func writeText(b *strings.Builder, s string) {
	doubled := `'`
	if strings.IndexByte(s, '\\') >= 0 {
		doubled = `'\`
		b.WriteString(" E'")
	} else {
		b.WriteByte('\'')
	}
	for {
		i := strings.IndexAny(s, doubled)
		if i < 0 {
			break
		}
		b.WriteString(s[:i+1])
		b.WriteByte(s[i])
		s = s[i+1:]
	}
	b.WriteString(s)
	b.WriteByte('\'')
}
