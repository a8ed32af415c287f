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
// retention (adr/0003) every PRUNE_INTERVAL until ctx ends. Replicas take turns through an advisory lock; a failed run is logged
// and retried at the next tick, since consumers never wait for it.
func PruneLoop(ctx context.Context, database *sqlx.DB, cfg config.Config, m *observe.Metrics, log *slog.Logger) {
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
		m.Pruned(res.Deleted)
		switch {
		case err != nil && ctx.Err() == nil:
			log.Error("inbox prune failed", "err", err, "deleted", res.Deleted)
		case res.Deleted > 0:
			log.Info("inbox pruned", "deleted", res.Deleted, "batches", res.Batches,
				"duration_ms", time.Since(start).Milliseconds())
		}
	}
}
