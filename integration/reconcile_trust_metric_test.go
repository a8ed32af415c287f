package integration

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// Whether the service's periodic pass trusted the reconciliation's
// checkpoint, and why not, shows in its metrics
// (transferconsumer_reconcile_checkpoint_trusted, one series, the last
// pass's): the first pass over a database that has none says none (0)
// and makes it; the next trusts it (1); after a person marks it
// (reconcile_checkpoint.distrust), the next pass says marked (0) and
// makes it anew, and the one after that trusts it again.
func TestTheCheckpointsDistrustShowsInTheMetrics(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	proc := startProcess(t, e.serviceEnv(1, "INSTANCE_NAME="+e.name+"-svc", "RECONCILE_INTERVAL=3s"))
	proc.waitConsuming(1)
	base := proc.httpAddr()
	series := regexp.MustCompile(`(?m)^transferconsumer_reconcile_checkpoint_trusted\{reason="([^"]*)"\} (\S+)$`)
	// trust is the series, as reason=value, one after the other.
	trust := func() string {
		var out []string
		for _, m := range series.FindAllStringSubmatch(getText(t, base+"/metrics"), -1) {
			out = append(out, m[1]+"="+m[2])
		}
		return strings.Join(out, " ")
	}
	wait := func(what, want string) {
		t.Helper()
		said := ""
		waitFor(t, 30*time.Second, what, func() bool {
			got := trust()
			if got != said {
				t.Logf("transferconsumer_reconcile_checkpoint_trusted: %s", got)
				said = got
			}
			return got == want
		})
	}
	wait("the first pass: no checkpoint", "none=0")
	wait("the next pass: trusted", "trusted=1")
	e.db.MustExec(`UPDATE reconcile_checkpoint SET distrust = 'marked by the test'`)
	wait("the pass after the mark: marked", "marked=0")
	wait("the checkpoint made anew: trusted", "trusted=1")
	if got := proc.field("reconciled", "checkpoint_not_trusted"); got == "" {
		t.Error("no pass logged why it did not trust the checkpoint")
	}
}
