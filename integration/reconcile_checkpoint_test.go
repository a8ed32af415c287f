package integration

import (
	"bytes"
	"context"
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

	"transferconsumer/db"
	"transferconsumer/event"
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
// database of dbURL and decodes its report.
func reconcileOn(t *testing.T, dbURL string, args ...string) (map[string]any, int) {
	t.Helper()
	c := exec.Command(buildService(t), append([]string{"reconcile", "--json", "--skip-dlq"}, args...)...)
	c.Env = append(os.Environ(), "DATABASE_URL="+dbURL)
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	err := c.Run()
	code := 0
	if exit, ok := errors.AsType[*exec.ExitError](err); ok {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("reconcile %v: %v", args, err)
	}
	var r map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("reconcile %v (exit %d): %v\n%s\n%s", args, code, err, stdout.String(), stderr.String())
	}
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

// A database dumped with its checkpoint and restored into another cluster,
// whose transaction ids start afresh: the transfers applied there after
// the restore have ids the checkpoint's cut-off would count as its own.
// The pass does not trust it (another cluster's, and ahead of the
// database's ids): it is a full one, which finds a drift put into a
// transfer applied after the restore, and makes the checkpoint anew.
func TestReconcileDistrustsACheckpointRestoredIntoAnotherCluster(t *testing.T) {
	parallel(t) // on servers of its own
	source, target := newPGCluster(t), newPGCluster(t)
	// The source has used more transaction ids than the target: one that
	// has run for a while (each subtransaction that writes takes an id).
	sourceAdmin := sqlx.MustOpen("postgres", source.adminURL())
	t.Cleanup(func() { sourceAdmin.Close() })
	sourceAdmin.MustExec(`CREATE TABLE burn (n int)`)
	sourceAdmin.MustExec(`DO $$ BEGIN FOR i IN 1..20000 LOOP
		BEGIN INSERT INTO burn VALUES (i); RAISE EXCEPTION 'undo'; EXCEPTION WHEN OTHERS THEN NULL; END;
	END LOOP; END $$`)
	e := newEnvOn(t, source.adminURL())
	a, b := "acc_a_"+e.name, "acc_b_"+e.name
	for _, tr := range []transfer{newTransfer(a, b, 10), newTransfer(b, a, 3)} {
		if _, err := e.apply(t, tr); err != nil {
			t.Fatal(err)
		}
	}
	if _, code := reconcileOn(t, e.dbURL, "--periodic"); code != 0 {
		t.Fatalf("the first periodic pass: exit %d", code)
	}

	dir := pgDataDir(t)
	dump := filepath.Join(dir, "dump")
	source.run("pg_dump", "-h", "127.0.0.1", "-p", strconv.Itoa(source.port), "-U", "postgres", "-Fc", "-f", dump, e.name)
	target.run("createdb", "-h", "127.0.0.1", "-p", strconv.Itoa(target.port), "-U", "postgres", e.name)
	target.run("pg_restore", "-h", "127.0.0.1", "-p", strconv.Itoa(target.port), "-U", "postgres", "-d", e.name, "--exit-on-error", dump)
	targetURL := fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", target.addr(), e.name)
	restored, err := db.Open(context.Background(), targetURL, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { restored.Close() })

	late := newTransfer(a, b, 7)
	ev, err := event.Decode(late.body(), late.EventID, late.EventType)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.NewInbox(restored).Apply(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
	var reused bool
	restored.Get(&reused, `SELECT t.created_xid < pg_snapshot_xmin(c.cutoff)::text::bigint
		FROM transfer t, reconcile_checkpoint c WHERE t.transfer_id = $1`, late.Data.TransferID)
	if !reused {
		t.Fatalf("the transfer applied after the restore has an id above the checkpoint's cut-off: the test's premise does not hold")
	}
	restored.MustExec(`UPDATE transfer SET amount_minor = 8 WHERE transfer_id = $1`, late.Data.TransferID)

	r, code := reconcileOn(t, targetURL, "--periodic")
	cp, _ := r["checkpoint"].(map[string]any)
	if code != 3 || r["pass"] != "full" || !strings.Contains(fmt.Sprint(cp["broken"]), "another cluster") || count(r, "drift") != 2 {
		t.Errorf("after the restore: exit %d, pass %v, checkpoint %v, drift %d; want 3, a full pass not trusting it (another cluster), 2 in drift",
			code, r["pass"], cp, count(r, "drift"))
	}
	if r, _ := reconcileOn(t, targetURL, "--periodic"); r["pass"] != "periodic" || count(r, "drift") != 2 {
		t.Errorf("the pass after: %v, drift %d; want a periodic one from the checkpoint made anew, the drift reported still", r["pass"], count(r, "drift"))
	}
}
