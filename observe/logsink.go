package observe

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"
)

// logSink batches log lines into few writes. The service logs one line per
// message; written one by one, that is a write system call per event on
// top of the database's and the broker's, and system calls are most of a
// consumer's CPU (BENCHMARKS.md). Lines are held at most `every`; warnings
// and errors are written at once (see flushAbove), and Close writes what is
// left, so only a SIGKILL can lose lines, at most the last `every` of them.
// The data never depends on a log line: the inbox is the record of what
// was applied.
type logSink struct {
	w     io.Writer
	limit int // write at once when this many bytes are held

	mu     sync.Mutex
	buf    []byte
	err    error // the first write error; later writes report it
	closed bool  // after Close, lines are written at once

	stop chan struct{}
	done chan struct{}
}

func newLogSink(w io.Writer, every time.Duration, limit int) *logSink {
	s := &logSink{w: w, limit: limit, stop: make(chan struct{}), done: make(chan struct{})}
	go s.flushEvery(every)
	return s
}

// Write keeps p, one whole log line from a slog handler, for the next flush.
func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return 0, s.err
	}
	s.buf = append(s.buf, p...)
	if s.closed || len(s.buf) >= s.limit {
		s.flushLocked()
	}
	return len(p), nil
}

// Flush writes every line held.
func (s *logSink) Flush() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushLocked()
	return s.err
}

func (s *logSink) flushLocked() {
	if len(s.buf) == 0 || s.err != nil {
		return
	}
	_, s.err = s.w.Write(s.buf)
	s.buf = s.buf[:0]
}

func (s *logSink) flushEvery(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Flush()
		}
	}
}

// Close stops the periodic flush and writes what is left; a line logged
// after Close (a goroutine finishing late) is written at once.
func (s *logSink) Close() error {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.flushLocked()
	return s.err
}

// flushAbove writes the sink at once after every record at level or above,
// so that warnings and errors are never held back.
type flushAbove struct {
	slog.Handler
	level slog.Level
	sink  *logSink
}

func (h flushAbove) Handle(ctx context.Context, r slog.Record) error {
	err := h.Handler.Handle(ctx, r)
	if r.Level >= h.level {
		if ferr := h.sink.Flush(); err == nil {
			err = ferr
		}
	}
	return err
}

func (h flushAbove) WithAttrs(attrs []slog.Attr) slog.Handler {
	return flushAbove{h.Handler.WithAttrs(attrs), h.level, h.sink}
}

func (h flushAbove) WithGroup(name string) slog.Handler {
	return flushAbove{h.Handler.WithGroup(name), h.level, h.sink}
}
