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
//
// Before each run it maintains the inbox's partitions (db.Maintain,
// adr/0011) when its role may: a role without DDL is refused once, says so,
// and leaves them to the owner's `migrate` (a daily CronJob).
func PruneLoop(ctx context.Context, database *sqlx.DB, cfg config.Config, m *observe.Metrics, log *slog.Logger) {
	tick := time.NewTicker(cfg.PruneInterval)
	defer tick.Stop()
	maintain := true
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if maintain {
			done, err := db.Maintain(ctx, database, cfg.InboxTTL)
			switch {
			case db.Refused(err):
				maintain = false
				log.Info("the database role may not maintain the inbox's partitions: the schema's owner must run `transferconsumer migrate` daily (adr/0011)", "err", err)
			case err != nil && ctx.Err() == nil:
				log.Error("inbox maintenance failed", "err", err)
			case len(done) > 0:
				log.Info("inbox partitions maintained", "done", done)
			}
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
