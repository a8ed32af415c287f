package integration

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
)

// Transfers changed since the checkpoint, kept until a person resolves
// them (adr/0007, sql/0020), and the bound on the lines a pass logs.

// A transfer the checkpoint counted, changed by hand with its two
// balances, so that no balance drifts: the service's scheduled full pass
// finds it, and its metric, which TransferConsumerTransfersChanged reads,
// says so from then on, through the periodic passes from the checkpoint
// made anew, a rebuild by hand and a restart, until a person resolves
// each account's finding.
func TestReconcileKeepsATransferChangedBehindTheCheckpoint(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	a, b, c := "acc_a_"+e.name, "acc_b_"+e.name, "acc_c_"+e.name
	old := newTransfer(a, b, 100)
	applyAll(t, e, old, newTransfer(b, c, 30), newTransfer(c, a, 4))
	if r, code := reconcileOn(t, e.dbURL, "--periodic"); code != 0 || r["pass"] != "full" {
		t.Fatalf("the first periodic pass: exit %d, pass %v; want 0, a full one that makes the checkpoint", code, r["pass"])
	}
	applyAll(t, e, newTransfer(a, c, 2))
	if r, code := reconcileOn(t, e.dbURL, "--periodic"); code != 0 || r["pass"] != "periodic" {
		t.Fatalf("the second periodic pass: exit %d, pass %v; want 0, a periodic one", code, r["pass"])
	}
	e.db.MustExec(`UPDATE transfer SET amount_minor = 90 WHERE transfer_id = $1`, old.Data.TransferID)
	e.db.MustExec(`UPDATE balance_projection SET balance_minor = balance_minor + 10 WHERE account = $1`, a)
	e.db.MustExec(`UPDATE balance_projection SET balance_minor = balance_minor - 10 WHERE account = $1`, b)
	e.db.MustExec(`UPDATE reconcile_checkpoint SET full_at = now() - interval '2 hours'`) // a full pass is due

	start := func(name string) (*process, func(string) float64) {
		proc := startProcess(t, e.serviceEnv(2, "INSTANCE_NAME="+e.name+"-"+name, "RECONCILE_INTERVAL=200ms", "RECONCILE_FULL_INTERVAL=1h"))
		proc.waitConsuming(1)
		base := proc.httpAddr()
		return proc, func(name string) float64 {
			return metricValue(getText(t, base+"/metrics"), "transferconsumer_reconcile_"+name)
		}
	}
	proc, metric := start("a")
	waitFor(t, 30*time.Second, "the full pass's finding in the metrics", func() bool {
		return proc.line("reconciled", "pass", "full") != nil && metric("changed_since_checkpoint") == 2
	})
	runs := proc.count("msg", "reconciled")
	waitFor(t, 30*time.Second, "three passes after the full one", func() bool { return proc.count("msg", "reconciled") >= runs+3 })
	if full, changed, drift := metric("last_run_full"), metric("changed_since_checkpoint"), metric("accounts_in_drift"); full != 0 || changed != 2 || drift != 0 {
		t.Errorf("after three more passes: last_run_full %v, changed_since_checkpoint %v, accounts_in_drift %v; want periodic passes reporting the two, no drift",
			full, changed, drift)
	}
	if got := proc.field("reconcile: transfers changed since the checkpoint", "account"); got != a {
		t.Errorf("changed logged for %q, want %s first", got, a)
	}
	if err := proc.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}

	// A rebuild by hand makes the checkpoint anew once more; it finds no
	// difference now, and reports the two kept; so does the read-only pass.
	r, code := reconcileOn(t, e.dbURL, "--rebuild")
	cp, _ := r["checkpoint"].(map[string]any)
	if code != 3 || count(r, "changed") != 2 || count(r, "drift") != 0 || cp["rebuilt"] != true || cp["differs"] != 0.0 {
		t.Errorf("reconcile --rebuild: exit %d, changed %d, drift %d, checkpoint %v; want 3, the two kept, no drift, made anew with no difference",
			code, count(r, "changed"), count(r, "drift"), cp)
	}
	if r, code := reconcileOn(t, e.dbURL); code != 3 || count(r, "changed") != 2 {
		t.Errorf("reconcile (read only): exit %d, changed %d; want 3, the two kept", code, count(r, "changed"))
	}

	proc, metric = start("b")
	waitFor(t, 30*time.Second, "the two in the metrics of a service started again", func() bool { return metric("changed_since_checkpoint") == 2 })
	resolve := func(account string) {
		e.db.MustExec(`INSERT INTO reconcile_resolved (kind, subject, note)
			SELECT kind, subject, 'a correction booked by hand, ticket 42' FROM reconcile_finding WHERE kind = 'changed' AND detail->>'account' = $1`, account)
	}
	resolve(a)
	waitFor(t, 30*time.Second, "one left once a person resolved the first", func() bool { return metric("changed_since_checkpoint") == 1 })
	resolve(b)
	waitFor(t, 30*time.Second, "none left once a person resolved both", func() bool { return metric("changed_since_checkpoint") == 0 })
	if err := proc.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	var kept int
	e.db.Get(&kept, `SELECT count(*) FROM reconcile_finding WHERE kind = 'changed'`)
	if kept != 2 {
		t.Errorf("%d changed findings left in reconcile_finding, want the two, resolved, kept for an audit", kept)
	}
}

// The scheduled full pass on a standby over six times more findings of
// each kind than a run logs: its log has logFirst lines of each kind (10)
// and one saying how many it left out, its summary counts them all, and
// the primary keeps them all.
func TestReconcileFullPassOnAStandbyLogsABoundedNumberOfLines(t *testing.T) {
	parallel(t) // on servers of its own
	primary := newPGCluster(t)
	admin := sqlx.MustOpen("postgres", primary.adminURL())
	t.Cleanup(func() { admin.Close() })
	standby := standbyOf(primary, "standby1", primary.addr())
	streaming(t, admin, "standby1", "async")
	e := newEnvOn(t, primary.adminURL())
	e.declare(2)
	const pairs, logged = 30, 10
	var trs []transfer
	for i := range pairs {
		trs = append(trs, newTransfer(fmt.Sprintf("acc_%02d_from_%s", i, e.name), fmt.Sprintf("acc_%02d_to_%s", i, e.name), 100))
	}
	applyAll(t, e, trs...)
	if r, code := reconcileOn(t, e.dbURL, "--periodic"); code != 0 || r["pass"] != "full" {
		t.Fatalf("the first periodic pass: exit %d, pass %v; want 0, a full one that makes the checkpoint", code, r["pass"])
	}
	// Every transfer the checkpoint holds, changed by hand: each of the 60
	// accounts drifts from its balance and differs from the checkpoint.
	e.db.MustExec(`UPDATE transfer SET amount_minor = amount_minor - 1`)
	e.db.MustExec(`UPDATE reconcile_checkpoint SET full_at = now() - interval '2 hours'`) // a full pass is due
	caughtUp(t, admin, standby)

	standbyURL := fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", standby.addr(), e.name)
	proc := startProcess(t, e.serviceEnv(2, "INSTANCE_NAME="+e.name+"-svc", "RECONCILE_INTERVAL=200ms",
		"RECONCILE_FULL_INTERVAL=1h", "RECONCILE_DATABASE_URL="+standbyURL))
	proc.waitConsuming(1)
	var summary map[string]any
	waitFor(t, 60*time.Second, "the full pass on the standby", func() bool {
		summary = proc.line("reconciled", "on", "standby")
		return summary != nil
	})
	if summary["drift"] != 2.0*pairs || summary["changed_since_checkpoint"] != 2.0*pairs {
		t.Errorf("the standby's summary: %v; want %d accounts in drift and %d changed, all counted", summary, 2*pairs, 2*pairs)
	}
	lines := map[string]int{}
	leftOut := map[string]any{}
	for _, l := range proc.linesWith("on", "standby") {
		msg := fmt.Sprint(l["msg"])
		lines[msg]++
		if msg == "reconcile: findings left out of the log" {
			leftOut[fmt.Sprint(l["kind"])] = l["left_out"]
		}
	}
	for _, msg := range []string{"reconcile: balance drift", "reconcile: transfers changed since the checkpoint"} {
		if lines[msg] != logged {
			t.Errorf("the standby's pass logged %d lines %q, want %d", lines[msg], msg, logged)
		}
	}
	for _, kind := range []string{"drift", "changed"} {
		if leftOut[kind] != float64(2*pairs-logged) {
			t.Errorf("the standby's pass left %v %s findings out of its log, want it to say %d", leftOut[kind], kind, 2*pairs-logged)
		}
	}
	total := 0
	for _, n := range lines {
		total += n
	}
	if total > 2*(logged+1)+1 {
		t.Errorf("the standby's pass logged %d lines: %v", total, lines)
	}
	var kept struct {
		Drift   int `db:"drift"`
		Changed int `db:"changed"`
	}
	waitFor(t, 30*time.Second, "every finding kept on the primary", func() bool {
		e.db.Get(&kept, `SELECT count(*) FILTER (WHERE kind = 'drift') AS drift, count(*) FILTER (WHERE kind = 'changed') AS changed FROM reconcile_finding`)
		return kept.Drift == 2*pairs && kept.Changed == 2*pairs
	})
	if n := proc.count("msg", "reconcile: the full pass on the standby failed"); n != 0 {
		t.Errorf("the full pass on the standby failed %d times", n)
	}
	if err := proc.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
}
