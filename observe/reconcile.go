package observe

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"transferconsumer/reconcile"
)

// reconcileGauges are the periodic reconciliation's series: -1 until the
// first run (and the dead letters' while the DLQ is not read).
type reconcileGauges struct {
	drift, duplicates, waiting, oldLetters, lastEnd, duration prometheus.Gauge
	lastFull, fullEnd, oldestFinding                          prometheus.Gauge
	changed                                                   prometheus.Gauge
	// trusted has one series, the last pass's reason: -1 with none
	// before the first.
	trusted *prometheus.GaugeVec
}

func newReconcileGauges(ns string) (reconcileGauges, []prometheus.Collector) {
	gauge := func(name, help string, initial float64) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "reconcile_" + name, Help: help})
		g.Set(initial)
		return g
	}
	g := reconcileGauges{
		drift:      gauge("accounts_in_drift", "Accounts whose balance is not the net of their transfers, at the last reconciliation; -1 before the first.", -1),
		duplicates: gauge("duplicate_intents", "Creations repeating another's intent within RECONCILE_WINDOW under another transferId, at the last reconciliation.", -1),
		waiting:    gauge("waiting_transitions", "Transitions waiting for their creation longer than RECONCILE_PENDING_AFTER, at the last reconciliation.", -1),
		oldLetters: gauge("old_dead_letters", "Dead letters older than INBOX_TTL or undated, at the last reconciliation; -1 when the DLQ was not read (RECONCILE_DLQ).", -1),
		lastEnd:    gauge("last_run_end_seconds", "Unix time the last reconciliation of this instance ended; 0 before the first.", 0),
		duration:   gauge("last_run_duration_seconds", "How long the last reconciliation of this instance took.", 0),
		lastFull:   gauge("last_run_full", "1 when the last reconciliation of this instance was a full pass over every transfer, 0 when it was a periodic one from the checkpoint.", 0),
		fullEnd: gauge("last_full_end_seconds", "Unix time the last full pass over every transfer ended, on whichever replica and server, as the database records it; "+
			"time() minus it is how long ago a transfer changed by hand could last have been found; 0 before the first.", 0),
		oldestFinding: gauge("oldest_finding_seconds", "Unix time the oldest finding still reported (a drift, a duplicate intent or a waiting transition: "+
			"each is reported until a pass finds it resolved; transfers changed since the checkpoint, until a person resolves them) was first seen; 0 when there is none.", 0),
		changed: gauge("changed_since_checkpoint", "Accounts whose transfers a full pass found changed or deleted by hand since the checkpoint (history edited), "+
			"each reported by every run until a person resolves it (reconcile_resolved), at the last reconciliation; -1 before the first.", -1),
	}
	g.trusted = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "reconcile_checkpoint_trusted",
		Help: "1 when the last periodic pass of this instance found the reconciliation's checkpoint trusted (reason trusted), 0 when it did not and so made it anew in a full pass, " +
			"reason saying why (none, forgotten, copied, incomplete, transfers-gone, marked, other: adr/0007); -1, without a reason, before the first pass."},
		[]string{"reason"})
	g.trusted.WithLabelValues("").Set(-1)
	return g, []prometheus.Collector{g.drift, g.duplicates, g.waiting, g.oldLetters, g.lastEnd, g.duration, g.lastFull, g.fullEnd, g.oldestFinding, g.changed, g.trusted}
}

// Reconciliation is what a periodic reconciliation found, for its series.
type Reconciliation struct {
	Drift, Duplicates, Waiting int           // accounts in drift, duplicate intents, waiting transitions
	Changed                    int           // accounts whose transfers were changed since the checkpoint, not yet resolved
	OldLetters                 int           // dead letters older than INBOX_TTL or undated; -1 when the DLQ was not read
	Took                       time.Duration // how long it took
	Full                       bool          // a full pass
	LastFull                   time.Time     // when the last full pass ended; zero before the first
	OldestFinding              *time.Time    // when the oldest finding still reported was first seen; nil for none
	// Checkpoint is why the pass did not trust the checkpoint
	// (reconcile.Checkpoint.TrustReason), reconcile.TrustTrusted when it did.
	Checkpoint string
}

// Reconciled sets the reconciliation's series to what the run that just
// ended found.
func (m *Metrics) Reconciled(r Reconciliation) {
	g := m.reconcile
	g.drift.Set(float64(r.Drift))
	g.duplicates.Set(float64(r.Duplicates))
	g.waiting.Set(float64(r.Waiting))
	g.changed.Set(float64(r.Changed))
	g.oldLetters.Set(float64(r.OldLetters))
	g.lastEnd.Set(float64(time.Now().UnixMilli()) / 1000)
	g.duration.Set(r.Took.Seconds())
	full, fullEnd, oldest := 0.0, 0.0, 0.0
	if r.Full {
		full = 1
	}
	if !r.LastFull.IsZero() {
		fullEnd = float64(r.LastFull.UnixMilli()) / 1000
	}
	if r.OldestFinding != nil {
		oldest = float64(r.OldestFinding.UnixMilli()) / 1000
	}
	g.lastFull.Set(full)
	g.fullEnd.Set(fullEnd)
	g.oldestFinding.Set(oldest)
	trusted := 0.0
	if r.Checkpoint == reconcile.TrustTrusted {
		trusted = 1
	}
	// One series, the last pass's reason: set before the others go, so
	// that a scrape meanwhile finds one.
	g.trusted.WithLabelValues(r.Checkpoint).Set(trusted)
	for _, reason := range append(reconcile.TrustReasons(), "") {
		if reason != r.Checkpoint {
			g.trusted.DeleteLabelValues(reason)
		}
	}
}
