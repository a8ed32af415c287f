package cli

import (
	"context"
	"log/slog"
	"slices"
	"strings"

	"transferconsumer/reconcile"
)

// logFirst bounds the lines any run logs per kind of finding, whatever it
// holds: the service's periodic pass reads this many of each kind, the
// full pass on a standby up to recordFirst, to write them down on the
// primary. Past it, one line says how many of the kind were left out, and
// the summary line counts them all.
const logFirst = 10

// logFindings logs the first logFirst of items with line, then, when
// count (all the kind's findings) is more, how many were left out.
func logFindings[T any](log *slog.Logger, kind string, items []T, count int, line func(T)) {
	shown := min(len(items), logFirst)
	for _, it := range items[:shown] {
		line(it)
	}
	if count > shown {
		log.Warn("reconcile: findings left out of the log", "kind", kind, "logged", shown, "left_out", count-shown, "count", count)
	}
}

// logReconcile logs the findings of rep, at most logFirst of each kind
// and a line for the rest, then one summary line.
func logReconcile(log *slog.Logger, rep reconcileReport) {
	logFindings(log, "drift", rep.Drift, rep.DriftCount, func(d reconcile.Drift) {
		attrs := []any{"account", d.Account, "expected", d.Expected, "difference", d.Difference}
		if d.Actual != nil {
			attrs = append(attrs, "actual", *d.Actual)
		} else {
			attrs = append(attrs, "actual", "no balance row")
		}
		log.Error("reconcile: balance drift", attrs...)
	})
	logFindings(log, "changed", rep.Changed, rep.ChangedCount, func(c reconcile.Changed) {
		attrs := []any{"account", c.Account, "transfers", c.Transfers, "checkpoint", c.Checkpoint, "difference", c.Difference,
			"checkpoint_made_at", c.CheckpointMadeAt}
		if c.FirstSeen != nil {
			attrs = append(attrs, "first_seen", *c.FirstSeen)
		}
		log.Error("reconcile: transfers changed since the checkpoint", attrs...)
	})
	logFindings(log, "duplicate", rep.Duplicates, rep.DupCount, func(d reconcile.Duplicate) {
		log.Warn("reconcile: suspected duplicate intent", "transfer_id", d.Transfer, "earlier_transfer_id", d.Earlier,
			"from_account", d.From, "to_account", d.To, "amount_minor", d.Amount, "currency", d.Currency,
			"apart_ms", d.CreatedAt.Sub(d.EarlierAt).Milliseconds())
	})
	logFindings(log, "waiting", rep.Waiting, rep.WaitCount, func(w reconcile.Waiting) {
		log.Warn("reconcile: transition waiting for its creation", "transfer_id", w.Transfer, "event_id", w.EventID,
			"event_type", w.EventType, "received_at", w.ReceivedAt, "waited_s", int64(rep.At.Sub(w.ReceivedAt).Seconds()))
	})
	logFindings(log, "old_dead_letter", rep.DeadLetters.Letters, rep.DeadLetters.Old+rep.DeadLetters.Undated, func(l deadLetter) {
		log.Warn("reconcile: dead letter the inbox can no longer prove harmless to replay", "event_id", l.EventID,
			"class", l.Class, "dead_since", l.DeadSince)
	})
	level := slog.LevelInfo
	if rep.findings() > 0 {
		level = slog.LevelWarn
	}
	attrs := []any{"pass", passName(rep.Reconciliation), "transfers", rep.Transfers, "accounts", rep.Accounts,
		"drift", rep.DriftCount, "changed_since_checkpoint", rep.ChangedCount, "duplicate_intents", rep.DupCount,
		"waiting_transitions", rep.WaitCount, "old_dead_letters", oldLetters(rep.DeadLetters), "duration_ms", rep.Duration.Milliseconds()}
	if rep.Checkpoint.Compared {
		attrs = append(attrs, "differ_from_checkpoint", rep.Checkpoint.Differs)
	}
	if why := strings.Join(slices.DeleteFunc([]string{rep.Checkpoint.Broken, rep.Checkpoint.Distrusted},
		func(s string) bool { return s == "" }), "; "); why != "" {
		attrs = append(attrs, "checkpoint_not_trusted", why)
	}
	if !rep.DeadLetters.Read {
		attrs = append(attrs, "dead_letters", rep.DeadLetters.Error) // why old_dead_letters is -1
	}
	log.Log(context.Background(), level, "reconciled", attrs...)
}
