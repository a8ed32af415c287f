package observe

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// Every record, plain or not, must come out of plainJSON exactly as slog's
// JSON handler writes it; most random records here take the plain path.
func TestPlainJSONMatchesSlog(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	pieces := []string{"a", "Z", "0", " ", "event_id", "-", "_", ".", "<", ">", "&", "'", "/", "~",
		`"`, `\`, "\n", "\t", "\x00", "\x1f", "\x7f", "é", "\u2028", "\xff"}
	str := func(plain bool) string {
		var sb strings.Builder
		for range r.IntN(6) {
			p := pieces[r.IntN(len(pieces))]
			if plain {
				p = pieces[r.IntN(14)]
			}
			sb.WriteString(p)
		}
		return sb.String()
	}
	zones := []*time.Location{time.UTC, time.FixedZone("x", -(3*3600 + 30*60)), time.FixedZone("y", 5*3600)}
	plain, total := 0, 4000
	for i := range total {
		clean := r.IntN(4) != 0 // most records are plain, as the service's are
		var at time.Time
		switch r.IntN(10) {
		case 0: // zero: slog leaves the time out
		case 1:
			at = time.Date(10000+r.IntN(5), 1, 1, 0, 0, 0, 0, time.UTC)
		default:
			at = time.Unix(r.Int64N(4e9), r.Int64N(1e9)/int64(1+r.IntN(1000))*int64(1+r.IntN(3))).In(zones[r.IntN(len(zones))])
			if r.IntN(2) == 0 {
				at = time.Now() // with a monotonic reading
			}
		}
		rec := slog.NewRecord(at, slog.Level(r.IntN(20)-8), str(clean), 0)
		for range r.IntN(9) {
			key := str(clean)
			if clean && key == "" {
				key = "k"
			}
			var v slog.Value
			switch n := r.IntN(10); {
			case n < 4:
				v = slog.StringValue(str(clean))
			case n < 6:
				v = slog.Int64Value(r.Int64() - r.Int64())
			case n == 6:
				v = slog.BoolValue(r.IntN(2) == 0)
			case n == 7:
				v = slog.Uint64Value(r.Uint64())
			case clean:
				v = slog.IntValue(r.IntN(1000))
			case n == 8:
				v = slog.AnyValue(errors.New(str(false)))
			default:
				v = slog.GroupValue(slog.Float64("f", r.Float64()), slog.Duration("d", time.Duration(r.Int64N(1e12))))
			}
			rec.AddAttrs(slog.Attr{Key: key, Value: v})
		}
		var want, got bytes.Buffer
		if err := slog.NewJSONHandler(&want, nil).Handle(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
		h := plainJSON{slog.NewJSONHandler(&got, nil), slog.LevelDebug - 10, &got}
		if err := h.Handle(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
		if got.String() != want.String() {
			t.Fatalf("record %d:\n got %q\nwant %q", i, got.String(), want.String())
		}
		if _, ok := appendPlainLine(nil, rec); ok {
			plain++
		}
	}
	if plain < total/2 {
		t.Errorf("only %d of %d records took the plain path", plain, total)
	}
	t.Logf("%d of %d records took the plain path", plain, total)
}

// The service's own per-event line takes the plain path.
func TestPlainJSONTakesTheEventLine(t *testing.T) {
	rec := slog.NewRecord(time.Now(), slog.LevelInfo, "event", 0)
	rec.AddAttrs(slog.String("event_id", "3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10"), slog.String("queue", "transfers.7"),
		slog.Bool("redelivered", false), slog.Int64("delivery_count", 0), slog.String("outcome", "applied"),
		slog.Int64("duration_us", 1234))
	if _, ok := appendPlainLine(nil, rec); !ok {
		t.Error("the event line fell back to slog's handler")
	}
}

func BenchmarkEventLine(b *testing.B) {
	for _, bc := range []struct {
		name string
		h    slog.Handler
	}{
		{"slog", slog.NewJSONHandler(discard{}, nil)},
		{"plain", plainJSON{slog.NewJSONHandler(discard{}, nil), slog.LevelInfo, discard{}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				rec := slog.NewRecord(time.Now(), slog.LevelInfo, "event", 0)
				rec.AddAttrs(slog.String("event_id", "3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10"),
					slog.String("queue", "transfers.7"), slog.Bool("redelivered", false),
					slog.Int64("delivery_count", 0), slog.String("outcome", "applied"), slog.Int64("duration_us", 1234))
				bc.h.Handle(context.Background(), rec)
			}
		})
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
