package db

import (
	"database/sql/driver"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/lib/pq"
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

// writeLiteral writes v as a literal. Text goes through pq.QuoteLiteral,
// which doubles quotes and, when there is a backslash, doubles it too in
// an escape string (E'…'): the literal reads the same whatever
// standard_conforming_strings says. Bytes are written in bytea's hex form,
// in an escape string as well (E'\\x…'), which no byte of the data can end
// early.
func writeLiteral(b *strings.Builder, v any) error {
	dv, err := driver.DefaultParameterConverter.ConvertValue(v)
	if err != nil {
		return err
	}
	switch x := dv.(type) {
	case nil:
		b.WriteString("NULL")
	case string:
		b.WriteString(pq.QuoteLiteral(x))
	case []byte:
		if x == nil {
			b.WriteString("NULL")
			return nil
		}
		b.WriteString(`E'\\x`)
		b.WriteString(hex.EncodeToString(x))
		b.WriteByte('\'')
	case int64:
		b.WriteByte('\'')
		b.WriteString(strconv.FormatInt(x, 10))
		b.WriteByte('\'')
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
