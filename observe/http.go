package observe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Serve serves /healthz (the process is alive), /readyz (see
// Health.readiness) and /metrics on ln until ctx ends. It starts before
// anything else, so both probes answer from the first instant.
func Serve(ctx context.Context, ln net.Listener, h *Health, m *Metrics, log *slog.Logger) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		code, body := h.readiness()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(body)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
	serveMux(ctx, ln, mux, "health and metrics", log)
}

// ServePprof serves Go's /debug/pprof on ln, an address of its own (by
// default the loopback interface): heap profiles and traces are not for
// whoever reaches the health port.
func ServePprof(ctx context.Context, ln net.Listener, log *slog.Logger) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	serveMux(ctx, ln, mux, "pprof", log)
}

// serveMux serves mux on ln until ctx ends.
func serveMux(ctx context.Context, ln net.Listener, mux *http.ServeMux, what string, log *slog.Logger) {
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	log.Info("serving "+what, "addr", ln.Addr().String())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error(what+" server stopped", "err", err)
	}
}
