package cli

import (
	"context"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"

	"transferconsumer/config"
	"transferconsumer/db"
	"transferconsumer/observe"
)

// PruneLoop is the prune command run by the service: it applies the inbox
// retention (adr/0003, adr/0009) every PRUNE_INTERVAL until ctx ends.
// Replicas take turns through an advisory lock; a failed run is logged and
// retried at the next tick, since consumers never wait for it. It reads the
// inbox ring's size at start and at every run, for /readyz and the metrics:
// an INBOX_TTL longer than the ring covers is said there and in the log.
func PruneLoop(ctx context.Context, database *sqlx.DB, cfg config.Config, m *observe.Metrics, h *observe.Health, log *slog.Logger) {
	warned := ""
	sawRing := func(ring db.Ring) {
		h.InboxRing(ring, cfg.InboxTTL)
		m.InboxRing(ring)
		if w := db.RingWarning(ring, cfg.InboxTTL); w != warned {
			if w != "" {
				log.Warn(w, "inbox_ttl", cfg.InboxTTL, "ring_slots", ring.Slots, "ring_width", ring.Width)
			}
			warned = w
		}
	}
	if ring, err := db.ReadRing(ctx, database); err == nil {
		sawRing(ring)
	} else if ctx.Err() == nil {
		log.Error("read the inbox ring", "err", err)
	}
	tick := time.NewTicker(cfg.PruneInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		start := time.Now()
		res, err := db.Prune(ctx, database, cfg.InboxTTL, cfg.PruneBatch)
		m.Pruned(res.Deleted, len(res.Truncated))
		if res.Ring.Slots > 0 {
			sawRing(res.Ring)
		}
		switch {
		case err != nil && ctx.Err() == nil:
			log.Error("inbox prune failed", "err", err, "deleted", res.Deleted, "truncated_slots", res.Truncated)
		case res.Deleted > 0 || len(res.Truncated) > 0 || len(res.Waiting) > 0:
			log.Info("inbox pruned", "truncated_slots", res.Truncated, "busy_slots", res.Waiting,
				"legacy_deleted", res.Deleted, "batches", res.Batches, "duration_ms", time.Since(start).Milliseconds())
		}
	}
}
