package observe

import (
	"io"
	"log/slog"
	"time"
)

// NewLogger returns the service's logger at level, in format (json or
// text), writing to w through a logSink: info and debug lines at most
// 100 ms late, warnings and errors at once. The returned function writes
// what is held; call it before exiting.
func NewLogger(w io.Writer, level slog.Level, format string) (*slog.Logger, func() error) {
	sink := newLogSink(w, 100*time.Millisecond, 64<<10)
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = plainJSON{slog.NewJSONHandler(sink, opts), level, sink}
	if format == "text" {
		h = slog.NewTextHandler(sink, opts)
	}
	return slog.New(flushAbove{h, slog.LevelWarn, sink}), sink.Close
}
