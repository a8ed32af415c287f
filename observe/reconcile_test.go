package observe

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"transferconsumer/config"
	"transferconsumer/reconcile"
)

// The checkpoint's trust is one series, the last periodic pass's: -1
// without a reason before the first, then 1 with reason trusted, or 0
// with why the pass did not trust it; a reason that no longer holds is
// gone.
func TestTheCheckpointsTrustIsThatOfTheLastPass(t *testing.T) {
	m := NewMetrics(&Health{}, config.Config{QueueCount: 1, Prefix: "transfers"})
	for _, step := range []struct {
		reason string // the pass's; none before the first
		want   float64
	}{
		{"", -1},
		{reconcile.TrustCopied, 0},
		{reconcile.TrustTrusted, 1},
		{reconcile.TrustMarked, 0},
	} {
		if step.reason != "" {
			m.Reconciled(Reconciliation{Checkpoint: step.reason})
		}
		ch := make(chan prometheus.Metric, 10)
		m.reconcile.trusted.Collect(ch)
		close(ch)
		var got []string
		for s := range ch {
			var d dto.Metric
			if err := s.Write(&d); err != nil {
				t.Fatal(err)
			}
			reason := d.GetLabel()[0].GetValue()
			got = append(got, reason)
			if reason != step.reason || d.GetGauge().GetValue() != step.want {
				t.Errorf("after a pass that said %q: a series %q at %v, want %q at %v", step.reason, reason, d.GetGauge().GetValue(), step.reason, step.want)
			}
		}
		if len(got) != 1 {
			t.Errorf("after a pass that said %q: series %q, want one", step.reason, got)
		}
	}
}
