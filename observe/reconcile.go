package observe

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// reconcileGauges are the periodic reconciliation's series: -1 until the
// first run (and the dead letters' while the DLQ is not read).
type reconcileGauges struct {
	drift, duplicates, waiting, oldLetters, lastEnd, duration prometheus.Gauge
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
	}
	return g, []prometheus.Collector{g.drift, g.duplicates, g.waiting, g.oldLetters, g.lastEnd, g.duration}
}

// Reconciliation is what a periodic reconciliation found, for its series.
type Reconciliation struct {
	Drift, Duplicates, Waiting int           // accounts in drift, duplicate intents, waiting transitions
	OldLetters                 int           // dead letters older than INBOX_TTL or undated; -1 when the DLQ was not read
	Took                       time.Duration // how long it took
}

// Reconciled sets the reconciliation's series to what the run that just
// ended found.
func (m *Metrics) Reconciled(r Reconciliation) {
	g := m.reconcile
	g.drift.Set(float64(r.Drift))
	g.duplicates.Set(float64(r.Duplicates))
	g.waiting.Set(float64(r.Waiting))
	g.oldLetters.Set(float64(r.OldLetters))
	g.lastEnd.Set(float64(time.Now().UnixMilli()) / 1000)
	g.duration.Set(r.Took.Seconds())
}
