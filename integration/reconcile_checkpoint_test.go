package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
)

// The periodic reconciliation's checkpoint (adr/0007): the scheduled full
// pass on a standby, and a checkpoint restored into another cluster.

// line returns the first log line whose msg is msg and whose key is value.
func (p *process) line(msg, key, value string) map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.lines {
		if l["msg"] == msg && fmt.Sprint(l[key]) == value {
			return l
		}
	}
	return nil
}

// reconcileOn runs `transferconsumer reconcile --json args…` on the
// database of dbURL and decodes its report. A pass that writes fails while
// a service's own pass holds the reconciliation's lock: it is run again
// until none does (a service runs one every RECONCILE_INTERVAL, a minute
// by default).
func reconcileOn(t *testing.T, dbURL string, args ...string) (map[string]any, int) {
	t.Helper()
	var r map[string]any
	code := 0
	waitFor(t, 60*time.Second, "a reconcile pass no other pass holds off", func() bool {
		c := exec.Command(buildService(t), append([]string{"reconcile", "--json", "--skip-dlq"}, args...)...)
		c.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
		var stdout, stderr bytes.Buffer
		c.Stdout, c.Stderr = &stdout, &stderr
		err := c.Run()
		code = 0
		if exit, ok := errors.AsType[*exec.ExitError](err); ok {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatalf("reconcile %v: %v", args, err)
		}
		if code == 1 && strings.Contains(stderr.String(), "holds the reconciliation's lock") {
			return false
		}
		if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
			t.Fatalf("reconcile %v (exit %d): %v\n%s\n%s", args, code, err, stdout.String(), stderr.String())
		}
		return true
	})
	return r, code
}

// count reads section's count in a report of reconcileOn.
func count(r map[string]any, section string) int {
	s, _ := r[section].(map[string]any)
	n, _ := s["count"].(float64)
	return int(n)
}

// With RECONCILE_DATABASE_URL naming a standby, the scheduled full pass
// reads there, and only reads: it finds a transfer the checkpoint holds
// changed by hand on the primary, and writes on the primary what it found.
// The primary's next pass, told the checkpoint is no longer to be trusted,
// makes it anew, and from then on the drift is reported by every periodic
// pass.
func TestReconcileFullPassOnAStandby(t *testing.T) {
	parallel(t) // on servers of its own
	primary := newPGCluster(t)
	admin := sqlx.MustOpen("postgres", primary.adminURL())
	t.Cleanup(func() { admin.Close() })
	standby := standbyOf(primary, "standby1", primary.addr())
	streaming(t, admin, "standby1", "async")
	e := newEnvOn(t, primary.adminURL())
	e.declare(2)
	a, b, c := "acc_a_"+e.name, "acc_b_"+e.name, "acc_c_"+e.name
	old := newTransfer(a, b, 100)
	for _, tr := range []transfer{old, newTransfer(b, c, 30), newTransfer(c, a, 4)} {
		if _, err := e.apply(t, tr); err != nil {
			t.Fatal(err)
		}
	}
	if r, code := reconcileOn(t, e.dbURL, "--periodic"); code != 0 || r["pass"] != "full" {
		t.Fatalf("the first periodic pass: exit %d, pass %v; want 0, a full one that makes the checkpoint", code, r["pass"])
	}
	e.db.MustExec(`UPDATE transfer SET amount_minor = 90 WHERE transfer_id = $1`, old.Data.TransferID)
	e.db.MustExec(`UPDATE reconcile_checkpoint SET full_at = now() - interval '2 hours'`) // a full pass is due
	caughtUp(t, admin, standby)

	standbyURL := fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", standby.addr(), e.name)
	proc := startProcess(t, e.serviceEnv(2, "INSTANCE_NAME="+e.name+"-svc", "RECONCILE_INTERVAL=200ms",
		"RECONCILE_FULL_INTERVAL=1h", "RECONCILE_DATABASE_URL="+standbyURL))
	proc.waitConsuming(1)
	var onStandby map[string]any
	waitFor(t, 60*time.Second, "the full pass on the standby", func() bool {
		onStandby = proc.line("reconciled", "on", "standby")
		return onStandby != nil
	})
	if onStandby["pass"] != "full" || onStandby["drift"] != 2.0 || onStandby["changed_since_checkpoint"] != 2.0 {
		t.Errorf("the standby's pass: %v; want a full pass finding 2 accounts in drift, 2 changed since the checkpoint", onStandby)
	}
	if n := proc.count("msg", "reconcile: the full pass on the standby failed"); n != 0 {
		t.Errorf("the full pass on the standby failed %d times", n)
	}
	base := proc.httpAddr()
	metric := func(name string) float64 {
		return metricValue(getText(t, base+"/metrics"), "transferconsumer_reconcile_"+name)
	}
	// The primary's passes: one full pass, the checkpoint made anew once
	// the standby's found it out of date, then periodic ones reporting
	// the drift.
	waitFor(t, 30*time.Second, "a periodic pass reporting the drift after the primary's full one", func() bool {
		return metric("accounts_in_drift") == 2 && metric("last_run_full") == 0 && proc.line("reconciled", "pass", "full") != nil
	})
	var full struct {
		FullAt  time.Time  `db:"full_at"`
		Claimed *time.Time `db:"full_claimed_until"`
		Now     time.Time  `db:"now"`
	}
	e.db.Get(&full, `SELECT full_at, full_claimed_until, now() FROM reconcile_checkpoint`)
	if full.Now.Sub(full.FullAt) > time.Minute || full.Claimed != nil {
		t.Errorf("the primary's record of the full pass: %+v; want it ended within the minute, unclaimed", full)
	}
	if got := metric("last_full_end_seconds"); got < float64(full.FullAt.Unix()-1) {
		t.Errorf("last_full_end_seconds %v; want the full pass's end, %s", got, full.FullAt)
	}
	if err := proc.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
}

// A database dumped (pg_dump -Fc) and restored (pg_restore) into a cluster
// made anew, which has used fewer transaction ids than the one it came
// from: the restored rows keep the old cluster's ids, which are ahead of
// the new one's counter, and mean nothing here. The first pass after the
// restore neutralizes them and makes the checkpoint anew, without
// comparing the transfers with the one restored; the passes after start
// from it and find nothing, pass after pass; transfers applied in the new
// cluster, and a failure of one made in the old, are each counted once;
// and a drift put into a transfer applied there is found on its two
// accounts, by exactly what was put.
func TestReconcileDistrustsACheckpointRestoredIntoAnotherCluster(t *testing.T) {
	parallel(t) // on servers of its own
	source, target := newPGCluster(t), newPGCluster(t)
	// The source has used more transaction ids than the target: one that
	// has run for a while (each subtransaction that writes takes an id).
	sourceAdmin := sqlx.MustOpen("postgres", source.adminURL())
	t.Cleanup(func() { sourceAdmin.Close() })
	burnXids(sourceAdmin, 20000)
	e := newEnvOn(t, source.adminURL())
	a, b, c := "acc_a_"+e.name, "acc_b_"+e.name, "acc_c_"+e.name
	first, failing := newTransfer(a, b, 10), newTransfer(a, c, 5)
	applyAll(t, e, first, newTransfer(b, a, 3), failing, transition(failing, "TransferFailed"))
	if r, code := reconcileOn(t, e.dbURL, "--periodic"); code != 0 || r["pass"] != "full" {
		t.Fatalf("the first periodic pass: exit %d, pass %v; want 0, a full one that makes the checkpoint", code, r["pass"])
	}
	// Transfers after the cut-off, some counted by a periodic pass before
	// the dump and some not: the restored checkpoint's cut-off did not see
	// them.
	early := newTransfer(c, b, 4)
	applyAll(t, e, early)
	if r, code := reconcileOn(t, e.dbURL, "--periodic"); code != 0 || r["pass"] != "periodic" {
		t.Fatalf("the second periodic pass: exit %d, pass %v; want 0, a periodic one", code, r["pass"])
	}
	applyAll(t, e, newTransfer(b, c, 6), transition(early, "TransferFailed"))

	dump := filepath.Join(pgDataDir(t), "dump")
	source.run("pg_dump", "-h", "127.0.0.1", "-p", strconv.Itoa(source.port), "-U", "postgres", "-Fc", "-f", dump, e.name)
	target.run("createdb", "-h", "127.0.0.1", "-p", strconv.Itoa(target.port), "-U", "postgres", e.name)
	target.run("pg_restore", "-h", "127.0.0.1", "-p", strconv.Itoa(target.port), "-U", "postgres", "-d", e.name, "--exit-on-error", dump)
	targetURL := fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", target.addr(), e.name)
	e.useAddr(target.addr())
	var ahead bool
	e.db.Get(&ahead, `SELECT max(created_xid) >= pg_snapshot_xmax(pg_current_snapshot())::text::bigint FROM transfer`)
	if !ahead {
		t.Fatal("the restored transfers' ids are not ahead of the new cluster's: the test's premise does not hold")
	}

	for i := range 3 {
		r, code := reconcileOn(t, targetURL, "--periodic")
		cp, _ := r["checkpoint"].(map[string]any)
		if code != 0 || count(r, "drift") != 0 || count(r, "changed") != 0 || r["pass"] != map[bool]string{true: "full", false: "periodic"}[i == 0] ||
			cp["rebuilt"] != (i == 0) || cp["compared"] != false && i == 0 {
			t.Fatalf("pass %d after the restore: exit %d, pass %v, drift %d, changed %d, checkpoint %v; want 0, the first a full one that makes the checkpoint anew without comparing, nothing found",
				i+1, code, r["pass"], count(r, "drift"), count(r, "changed"), cp)
		}
		if i == 0 && !strings.Contains(fmt.Sprint(cp["broken"]), "another cluster") {
			t.Errorf("the first pass after the restore: checkpoint %v; want it to say why it was not trusted (another cluster's ids)", cp)
		}
	}

	// Applied in the new cluster: two creations, and the failure of a
	// transfer made in the old one.
	late := newTransfer(a, b, 7)
	applyAll(t, e, late, newTransfer(c, a, 2), transition(first, "TransferFailed"))
	for i := range 3 {
		r, code := reconcileOn(t, targetURL, "--periodic")
		if want := map[bool]float64{true: 3, false: 0}[i == 0]; code != 0 || r["pass"] != "periodic" || r["transfers"] != want || count(r, "drift") != 0 {
			t.Fatalf("pass %d after transfers applied in the new cluster: exit %d, pass %v, transfers %v, drift %d; want 0, a periodic pass over %v, nothing found",
				i+1, code, r["pass"], r["transfers"], count(r, "drift"), want)
		}
	}
	if r, code := reconcileOn(t, targetURL); code != 0 || count(r, "changed") != 0 {
		t.Errorf("a full pass (read only): exit %d, drift %d, changed %d; want the transfers to sum to the balances and to the checkpoint",
			code, count(r, "drift"), count(r, "changed"))
	}

	planted := newTransfer(b, c, 9)
	applyAll(t, e, planted)
	e.db.MustExec(`UPDATE transfer SET amount_minor = 8 WHERE transfer_id = $1`, planted.Data.TransferID)
	r, code := reconcileOn(t, targetURL, "--periodic")
	drift, _ := r["drift"].(map[string]any)
	items, _ := drift["items"].([]any)
	got := map[string]float64{}
	for _, it := range items {
		d, _ := it.(map[string]any)
		got[fmt.Sprint(d["account"])] = d["difference"].(float64)
	}
	if code != 3 || r["pass"] != "periodic" || len(got) != 2 || got[b] != -1 || got[c] != 1 {
		t.Errorf("after a transfer applied in the new cluster was changed: exit %d, pass %v, drift %v; want 3, a periodic pass, %s -1 and %s +1 (balance − transfers)",
			code, r["pass"], got, b, c)
	}
}

// burnXids has the server of admin use n transaction ids (each
// subtransaction that writes takes one).
func burnXids(admin *sqlx.DB, n int) {
	admin.MustExec(`CREATE TABLE IF NOT EXISTS burn (n int)`)
	admin.MustExec(fmt.Sprintf(`DO $$ BEGIN FOR i IN 1..%d LOOP
		BEGIN INSERT INTO burn VALUES (i); RAISE EXCEPTION 'undo'; EXCEPTION WHEN OTHERS THEN NULL; END;
	END LOOP; END $$`, n))
}

// applyAll applies each event to e's database, one transaction each.
func applyAll(t *testing.T, e *env, trs ...transfer) {
	t.Helper()
	for _, tr := range trs {
		if _, err := e.apply(t, tr); err != nil {
			t.Fatal(err)
		}
	}
}
