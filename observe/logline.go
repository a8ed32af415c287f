package observe

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"
)

// plainJSON writes the common log line, one whose message, keys and string
// values are plain ASCII and whose values are strings, integers or
// booleans (the per-event line always is), straight into a buffer, byte for
// byte as slog's JSON handler would; any other record goes to that handler.
// slog's general path costs the service about as much CPU per event as
// decoding the message (BENCHMARKS.md); TestPlainJSONMatchesSlog holds the
// two outputs equal.
type plainJSON struct {
	json  slog.Handler // slog's own, for every other record
	level slog.Leveler
	w     io.Writer
}

var lineBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

func (h plainJSON) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level.Level() }

func (h plainJSON) Handle(ctx context.Context, r slog.Record) error {
	bp := lineBufs.Get().(*[]byte)
	defer lineBufs.Put(bp)
	b, ok := appendPlainLine((*bp)[:0], r)
	if !ok {
		return h.json.Handle(ctx, r)
	}
	*bp = b
	_, err := h.w.Write(b)
	return err
}

// WithAttrs and WithGroup leave the plain path: the service uses neither.
func (h plainJSON) WithAttrs(as []slog.Attr) slog.Handler { return h.json.WithAttrs(as) }
func (h plainJSON) WithGroup(name string) slog.Handler    { return h.json.WithGroup(name) }

// appendPlainLine appends r as slog's JSON handler writes it, or reports
// false if r holds anything but plain strings, integers and booleans.
func appendPlainLine(b []byte, r slog.Record) ([]byte, bool) {
	b = append(b, '{')
	if !r.Time.IsZero() {
		t := r.Time.Round(0)
		if y := t.Year(); y < 0 || y >= 10000 {
			return b, false
		}
		b = append(b, `"time":"`...)
		b = t.AppendFormat(b, time.RFC3339Nano)
		b = append(b, `",`...)
	}
	b = append(b, `"level":`...)
	b, ok := appendPlain(b, r.Level.String())
	if !ok {
		return b, false
	}
	b = append(b, `,"msg":`...)
	if b, ok = appendPlain(b, r.Message); !ok {
		return b, false
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "" {
			ok = false // slog drops or inlines these: leave them to it
			return false
		}
		b = append(b, ',')
		if b, ok = appendPlain(b, a.Key); !ok {
			return false
		}
		b = append(b, ':')
		switch v := a.Value; v.Kind() {
		case slog.KindString:
			b, ok = appendPlain(b, v.String())
		case slog.KindInt64:
			b = strconv.AppendInt(b, v.Int64(), 10)
		case slog.KindUint64:
			b = strconv.AppendUint(b, v.Uint64(), 10)
		case slog.KindBool:
			b = strconv.AppendBool(b, v.Bool())
		default:
			ok = false
		}
		return ok
	})
	return append(b, "}\n"...), ok
}

// appendPlain appends s quoted, if no byte of it needs escaping in JSON.
func appendPlain(b []byte, s string) ([]byte, bool) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c > '~' || c == '"' || c == '\\' {
			return b, false
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), true
}
