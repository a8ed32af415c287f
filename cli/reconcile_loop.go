package cli

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	"transferconsumer/config"
	"transferconsumer/db"
	"transferconsumer/observe"
	"transferconsumer/reconcile"
)

// ReconcileLoop is the reconcile command run by the service: it runs the
// periodic pass every RECONCILE_INTERVAL until ctx ends, the first time a
// minute after start (or sooner, with a shorter interval), so that a
// replica restarted more often than the interval still reports. Each pass
// starts from the checkpoint the one before left; it is a full pass when
// the checkpoint cannot be trusted, and, without RECONCILE_DATABASE_URL,
// when RECONCILE_FULL_INTERVAL has passed since the last (with it, the
// scheduled full pass reads the standby: fullOnStandby). Replicas take
// turns through a transaction-scoped advisory lock, as retention does: a
// run that finds another running does nothing. A failed run is logged and
// retried at the next tick.
func ReconcileLoop(ctx context.Context, database *sqlx.DB, cfg config.Config, m *observe.Metrics, log *slog.Logger) {
	if cfg.ReconcileEvery <= 0 {
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	if standby, _ := cfg.ReconcileDatabase(); standby != "" && cfg.ReconcileFull > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); fullOnStandby(ctx, database, standby, cfg, log) }()
	}
	atEveryInterval(ctx, cfg.ReconcileEvery, func() {
		// A bound, so that a pass on an overloaded server cannot hold
		// its snapshot (and vacuum's horizon with it) for ever; never
		// tighter than ten minutes, whatever a short interval says, and a
		// day for a pass that may be a full one.
		run, cancel := context.WithTimeout(ctx, fullBound(cfg))
		defer cancel()
		letters := dlqNone
		if cfg.ReconcileDLQ {
			letters = dlqByService
		}
		rep, err := runReconcile(run, database, cfg, logFirst, passPeriodic, fullEvery(cfg), true, letters, 0)
		switch {
		case err != nil && ctx.Err() == nil:
			log.Error("reconcile failed", "err", err)
		case err == nil && rep.Ran:
			m.Reconciled(observe.Reconciliation{Drift: rep.DriftCount, Duplicates: rep.DupCount, Waiting: rep.WaitCount,
				Changed: rep.ChangedCount, OldLetters: oldLetters(rep.DeadLetters), Took: rep.Duration, Full: rep.Full,
				LastFull: rep.LastFull(), OldestFinding: rep.OldestFinding, Checkpoint: rep.Checkpoint.TrustReason()})
			logReconcile(log, rep)
		}
	})
}

// atEveryInterval calls tick every interval until ctx ends, the first time
// a minute after start (or sooner, with a shorter interval), so that a
// replica restarted more often than the interval still runs it. A tick
// that ends late delays the next: ticks never overlap.
func atEveryInterval(ctx context.Context, interval time.Duration, tick func()) {
	wait := min(interval, time.Minute)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = interval
		tick()
	}
}

// fullEvery is how often the periodic run is a full pass on the primary:
// RECONCILE_FULL_INTERVAL, or never when a standby takes the scheduled
// full pass (RECONCILE_DATABASE_URL).
func fullEvery(cfg config.Config) time.Duration {
	if standby, _ := cfg.ReconcileDatabase(); standby != "" {
		return 0
	}
	return cfg.ReconcileFull
}

// fullBound bounds a pass that may be a full one: a day, or the interval
// when longer. A full pass over billions of transfers takes hours; one that
// cannot end within a day belongs on a standby (RECONCILE_DATABASE_URL).
func fullBound(cfg config.Config) time.Duration {
	return max(cfg.ReconcileEvery, 24*time.Hour)
}

// recordFirst bounds the findings of each kind a full pass on a standby
// writes on the primary; all are counted. Its log is bounded by logFirst,
// as every run's.
const recordFirst = 100_000

// fullOnStandby runs the scheduled full pass on the standby standby (a
// URL) every RECONCILE_FULL_INTERVAL: at each RECONCILE_INTERVAL it asks
// the primary whether one is due and claims it (one replica at a time),
// reads every transfer on the standby, which only reads, and writes on the
// primary what it found: its findings, which the periodic passes report
// from then on until resolved, and, when the transfers no longer sum to
// the checkpoint, a mark that has the next periodic pass, on the primary,
// make it anew.
func fullOnStandby(ctx context.Context, primary *sqlx.DB, standby string, cfg config.Config, log *slog.Logger) {
	atEveryInterval(ctx, cfg.ReconcileEvery, func() {
		claimed, err := reconcile.ClaimFull(ctx, primary, cfg.ReconcileFull, fullBound(cfg))
		if err != nil || !claimed {
			if err != nil && ctx.Err() == nil {
				log.Error("reconcile: claim the full pass on the standby", "err", err)
			}
			return
		}
		run, cancel := context.WithTimeout(ctx, fullBound(cfg))
		defer cancel()
		rep, err := readStandby(run, standby, cfg)
		if err == nil {
			err = reconcile.RecordFull(run, primary, rep.Reconciliation)
		}
		if err != nil {
			if ctx.Err() == nil {
				log.Error("reconcile: the full pass on the standby failed", "err", err)
			}
			if err := reconcile.ReleaseFull(context.WithoutCancel(ctx), primary); err != nil {
				log.Error("reconcile: release the full pass's claim", "err", err)
			}
			return
		}
		logReconcile(log.With("on", "standby"), rep)
	})
}

// readStandby is one full pass on the standby.
func readStandby(ctx context.Context, standby string, cfg config.Config) (reconcileReport, error) {
	database, err := db.Open(ctx, standby, 2)
	if err != nil {
		return reconcileReport{}, fmt.Errorf("reconcile: RECONCILE_DATABASE_URL: %w", err)
	}
	defer database.Close()
	return runReconcile(ctx, database, cfg, recordFirst, passFull, 0, false, dlqNone, 0)
}
