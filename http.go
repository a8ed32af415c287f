package main

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

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"transferconsumer/consumer"
)

// serveHTTP serves /healthz (the process is alive), /readyz (broker
// connected, every queue consumed, database answering), /metrics and, when
// asked, /debug/pprof on ln until ctx ends.
func serveHTTP(ctx context.Context, ln net.Listener, svc *consumer.Service, database *sqlx.DB, m *metrics, pprofOn bool, log *slog.Logger) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		st := svc.State()
		dbErr := pingDB(database)
		ready := st.Connected && st.Consuming == st.Queues && dbErr == nil && len(st.Blocked) == 0
		body := map[string]any{
			"ready":            ready,
			"broker_connected": st.Connected,
			"queues_consumed":  st.Consuming,
			"queues":           st.Queues,
			"database_up":      dbErr == nil,
		}
		if dbErr != nil {
			body["database_error"] = redactErr(dbErr)
		}
		if len(st.Blocked) > 0 {
			blocked := make([]map[string]any, 0, len(st.Blocked))
			for _, b := range st.Blocked {
				blocked = append(blocked, map[string]any{
					"queue": b.Queue, "event_id": b.EventID, "since": b.Since.UTC().Format(time.RFC3339Nano),
					"class": string(b.Class), "attempts": b.Attempts, "reason": redactText(b.Reason),
				})
			}
			body["blocked_queues"] = blocked
		}
		if st.PublishBlocked != "" {
			body["broker_alarm"] = st.PublishBlocked
		}
		w.Header().Set("Content-Type", "application/json")
		if !ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(body)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
	if pprofOn {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}

	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	log.Info("serving health and metrics", "addr", ln.Addr().String())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("health and metrics server stopped", "err", err)
	}
}
