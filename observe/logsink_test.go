package observe

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// recordingWriter keeps every Write as one call, and signals each.
type recordingWriter struct {
	mu     sync.Mutex
	writes []string
	wrote  chan struct{}
}

func newRecordingWriter() *recordingWriter {
	return &recordingWriter{wrote: make(chan struct{}, 1000)}
}

func (w *recordingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.writes = append(w.writes, string(p))
	w.mu.Unlock()
	w.wrote <- struct{}{}
	return len(p), nil
}

func (w *recordingWriter) all() (calls int, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.writes), strings.Join(w.writes, "")
}

func TestLogSinkHoldsInfoAndWritesWarningsAtOnce(t *testing.T) {
	w := newRecordingWriter()
	sink := newLogSink(w, time.Hour, 1<<20) // no periodic flush within the test
	log := slog.New(flushAbove{slog.NewJSONHandler(sink, nil), slog.LevelWarn, sink})

	log.Info("event", "n", 1)
	log.Info("event", "n", 2)
	if calls, _ := w.all(); calls != 0 {
		t.Fatalf("info lines written at once (%d writes), want them held", calls)
	}
	log.Warn("retrying", "n", 3)
	calls, text := w.all()
	if calls != 1 {
		t.Fatalf("%d writes after a warning, want 1 carrying all three lines", calls)
	}
	for i, want := range []string{`"n":1`, `"n":2`, `"n":3`} {
		if got := strings.Split(strings.TrimSpace(text), "\n"); len(got) != 3 || !strings.Contains(got[i], want) {
			t.Fatalf("lines out of order or cut: %q", text)
		}
	}
	log.With("queue", "q").Error("dead-letter")
	if calls, _ := w.all(); calls != 2 {
		t.Errorf("an error through a derived logger was held: %d writes", calls)
	}
	log.Info("last")
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	if _, text := w.all(); !strings.HasSuffix(text, "\"msg\":\"last\"}\n") {
		t.Errorf("Close did not write the held line: %q", text)
	}
	log.Info("after close")
	if _, text := w.all(); !strings.HasSuffix(text, "\"msg\":\"after close\"}\n") {
		t.Errorf("a line logged after Close was held: %q", text)
	}
}

func TestLogSinkWritesWhenFullAndOnTime(t *testing.T) {
	w := newRecordingWriter()
	sink := newLogSink(w, time.Hour, 100)
	sink.Write(bytes.Repeat([]byte("a"), 60))
	if calls, _ := w.all(); calls != 0 {
		t.Fatal("written before the limit")
	}
	sink.Write(bytes.Repeat([]byte("b"), 60))
	if calls, text := w.all(); calls != 1 || len(text) != 120 {
		t.Fatalf("at the limit: %d writes of %d bytes, want 1 of 120", calls, len(text))
	}
	sink.Close()

	w = newRecordingWriter()
	sink = newLogSink(w, 10*time.Millisecond, 1<<20)
	defer sink.Close()
	sink.Write([]byte("line\n"))
	select {
	case <-w.wrote:
	case <-time.After(10 * time.Second):
		t.Fatal("a held line was not written by the periodic flush")
	}
}

func TestLogSinkKeepsConcurrentLinesWhole(t *testing.T) {
	w := newRecordingWriter()
	sink := newLogSink(w, time.Millisecond, 512)
	log := slog.New(flushAbove{slog.NewJSONHandler(sink, nil), slog.LevelWarn, sink})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				if i%50 == 0 {
					log.Warn("event", "g", g, "i", i)
				} else {
					log.Info("event", "g", g, "i", i)
				}
			}
		}()
	}
	wg.Wait()
	sink.Close()
	_, text := w.all()
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	if len(lines) != 1600 {
		t.Fatalf("%d lines, want 1600", len(lines))
	}
	seen := map[string]bool{}
	for _, l := range lines {
		var g, i int
		if _, err := fmt.Sscanf(l[strings.Index(l, `"g":`):], `"g":%d,"i":%d}`, &g, &i); err != nil {
			t.Fatalf("line cut or mixed: %q", l)
		}
		seen[fmt.Sprint(g, "/", i)] = true
	}
	if len(seen) != 1600 {
		t.Errorf("%d distinct lines, want 1600", len(seen))
	}
}
