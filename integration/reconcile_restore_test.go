package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"transferconsumer/db"
)

// What the periodic reconciliation does after each way a database is put
// back or moved (adr/0007, "After a restore"), on clusters of the test's
// own. A dump restored into a cluster made anew:
// TestReconcileDistrustsACheckpointRestoredIntoAnotherCluster.

// passReport is what one `reconcile --periodic --json` said.
type passReport struct {
	code       int
	pass       string
	transfers  float64
	drift      int
	changed    int
	checkpoint map[string]any
}

func (p passReport) String() string {
	return fmt.Sprintf("exit %d, pass %s over %v transfers, drift %d, changed %d, checkpoint %v",
		p.code, p.pass, p.transfers, p.drift, p.changed, p.checkpoint)
}

// periodicOn runs one periodic pass on the database of dbURL.
func periodicOn(t *testing.T, dbURL string) passReport {
	t.Helper()
	r, code := reconcileOn(t, dbURL, "--periodic")
	p := passReport{code: code, drift: count(r, "drift"), changed: count(r, "changed")}
	p.pass, _ = r["pass"].(string)
	p.transfers, _ = r["transfers"].(float64)
	p.checkpoint, _ = r["checkpoint"].(map[string]any)
	return p
}

// cleanPasses runs n periodic passes on dbURL, each of which must find
// nothing (exit 0): the first a full one when firstFull, which makes the
// checkpoint anew without comparing the transfers with the one it found,
// then periodic ones over none. It returns the first.
func cleanPasses(t *testing.T, dbURL string, n int, firstFull bool, when string) passReport {
	t.Helper()
	var first passReport
	for i := range n {
		p := periodicOn(t, dbURL)
		full := firstFull && i == 0
		if p.code != 0 || p.drift != 0 || p.changed != 0 || p.pass != map[bool]string{true: "full", false: "periodic"}[full] ||
			full && (p.checkpoint["rebuilt"] != true || p.checkpoint["compared"] != false) || !full && p.transfers != 0 && i > 0 {
			t.Fatalf("pass %d %s: %s; want nothing found, the first a full pass (%v) that makes the checkpoint anew without comparing",
				i+1, when, p, firstFull)
		}
		if i == 0 {
			first = p
		}
	}
	return first
}

// adminOf opens the maintenance database of c.
func adminOf(t *testing.T, c *pgCluster) *sqlx.DB {
	t.Helper()
	admin := sqlx.MustOpen("postgres", c.adminURL())
	t.Cleanup(func() { admin.Close() })
	return admin
}

// dumpInto dumps the database name of source (pg_dump -Fc) and restores
// it into target (createdb, pg_restore).
func dumpInto(t *testing.T, source, target *pgCluster, name string) {
	t.Helper()
	dump := filepath.Join(pgDataDir(t), "dump")
	source.run("pg_dump", "-h", "127.0.0.1", "-p", strconv.Itoa(source.port), "-U", "postgres", "-Fc", "-f", dump, name)
	target.run("createdb", "-h", "127.0.0.1", "-p", strconv.Itoa(target.port), "-U", "postgres", name)
	target.run("pg_restore", "-h", "127.0.0.1", "-p", strconv.Itoa(target.port), "-U", "postgres", "-d", name, "--exit-on-error", dump)
}

// A dump restored into a cluster whose counter has passed every id the
// restored transfers hold, but not the restored checkpoint's cut-off:
// nothing is neutralized (this cluster's snapshots see every restored
// id), yet transfers made here get ids that the copied cut-off counts as
// its own. The checkpoint is not trusted (copied), even after a standby's
// claim updated it before any pass: the first pass is a full one, and
// each transfer is counted.
func TestReconcileDoesNotTrustACheckpointCopiedFromAClusterAhead(t *testing.T) {
	parallel(t) // on servers of its own
	source, target := newPGCluster(t), newPGCluster(t)
	e := newEnvOn(t, source.adminURL())
	a, b := "acc_a_"+e.name, "acc_b_"+e.name
	applyAll(t, e, newTransfer(a, b, 10), newTransfer(b, a, 3))
	// The ids the source gives between its last transfer and its cut-off:
	// the target's counter will stand among them.
	burnXids(adminOf(t, source), 5000)
	if p := periodicOn(t, e.dbURL); p.code != 0 || p.pass != "full" {
		t.Fatalf("the first periodic pass: %s; want 0, a full one that makes the checkpoint", p)
	}
	var last int64
	e.db.Get(&last, `SELECT max(created_xid) FROM transfer`)

	dumpInto(t, source, target, e.name)
	targetURL := fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", target.addr(), e.name)
	e.useAddr(target.addr())
	var next int64
	e.db.Get(&next, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`)
	if next >= last+2500 {
		t.Fatalf("the target's counter (%d) is already past the middle of the source's last ids (%d + 2500): the test's premise does not hold", next, last)
	}
	burnXids(adminOf(t, target), int(last+2500-next))
	// A standby's claim, before any pass here.
	e.db.MustExec(`UPDATE reconcile_checkpoint SET full_claimed_until = NULL`)
	late := newTransfer(a, b, 7)
	applyAll(t, e, late, newTransfer(b, a, 1))
	var inCutoff bool
	e.db.Get(&inCutoff, `SELECT pg_visible_in_snapshot(t.created_xid::text::xid8, c.cutoff)
		FROM transfer t, reconcile_checkpoint c WHERE t.transfer_id = $1`, late.Data.TransferID)
	if !inCutoff {
		t.Fatal("the transfer made after the restore is not in the copied cut-off: the test's premise does not hold")
	}

	first := cleanPasses(t, targetURL, 3, true, "after the restore")
	if !strings.Contains(fmt.Sprint(first.checkpoint["broken"]), "copied") || first.checkpoint["neutralized"] != nil {
		t.Errorf("the first pass after the restore: %s; want it to say the checkpoint was copied, and nothing neutralized", first)
	}
	applyAll(t, e, newTransfer(a, b, 2), newTransfer(b, a, 5))
	if p := periodicOn(t, targetURL); p.code != 0 || p.pass != "periodic" || p.transfers != 2 {
		t.Errorf("after two transfers: %s; want 0, a periodic pass over 2", p)
	}
}

// Logical replication into a cluster made anew, then a switch to it: a
// publication FOR ALL TABLES on the source (wal_level=logical), a
// subscription from a cluster holding the schema and no row; the periodic
// passes run on the source while it replicates, then writes stop, the
// subscriber catches up and the reconciliation moves to it. Every pass
// before and after the switch finds nothing; the first after it makes the
// checkpoint anew (the replicated rows hold the source's ids, and the
// checkpoint is a copy); transfers applied after the switch are counted
// once.
func TestReconcileAcrossASwitchToALogicalReplica(t *testing.T) {
	parallel(t) // on servers of its own
	source, subscriber := newPGCluster(t, "wal_level = logical"), newPGCluster(t)
	burnXids(adminOf(t, source), 20000) // the source's ids are ahead of the subscriber's
	e := newEnvOn(t, source.adminURL())
	a, b, c := "acc_a_"+e.name, "acc_b_"+e.name, "acc_c_"+e.name
	first := newTransfer(a, b, 10)
	applyAll(t, e, first, newTransfer(b, c, 4))
	if p := periodicOn(t, e.dbURL); p.code != 0 || p.pass != "full" {
		t.Fatalf("the first periodic pass: %s; want 0, a full one that makes the checkpoint", p)
	}

	// The subscriber: the schema the service's migrations make, without
	// the rows they write, which the subscription copies.
	adminOf(t, subscriber).MustExec(`CREATE DATABASE ` + e.name)
	subURL := fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", subscriber.addr(), e.name)
	sub := sqlx.MustOpen("postgres", subURL)
	t.Cleanup(func() { sub.Close() })
	if _, err := db.Migrate(t.Context(), sub, os.DirFS("../sql")); err != nil {
		t.Fatal(err)
	}
	sub.MustExec(`TRUNCATE schema_migration, reconcile_checkpoint`)
	e.db.MustExec(`CREATE PUBLICATION reconcile_switch FOR ALL TABLES`)
	sub.MustExec(fmt.Sprintf(`CREATE SUBSCRIPTION reconcile_switch
		CONNECTION 'host=127.0.0.1 port=%d user=postgres dbname=%s' PUBLICATION reconcile_switch`, source.port, e.name))
	t.Cleanup(func() { _, _ = sub.Exec(`ALTER SUBSCRIPTION reconcile_switch DISABLE`) })

	// Passes on the source while it replicates, transfers between them:
	// two creations, one of them failed.
	for i := range 3 {
		failed := newTransfer(c, b, 2)
		applyAll(t, e, failed, newTransfer(a, c, int64(5+i)), transition(failed, "TransferFailed"))
		if p := periodicOn(t, e.dbURL); p.code != 0 || p.pass != "periodic" || p.transfers != 2 {
			t.Fatalf("pass %d on the source while it replicates: %s; want 0, a periodic pass over 2", i+1, p)
		}
	}
	applyAll(t, e, newTransfer(b, a, 6)) // after the source's last cut-off

	// Writes stop; the subscriber catches up; the switch.
	const state = `SELECT (SELECT count(*) FROM transfer) || ' ' || (SELECT count(*) FROM transfer_failure) || ' ' ||
		(SELECT string_agg(account || '=' || balance_minor, ',' ORDER BY account) FROM balance_projection) || ' ' ||
		(SELECT coalesce(cutoff::text, '') FROM reconcile_checkpoint) || ' ' || (SELECT count(*) FROM reconcile_checkpoint_net)`
	var want string
	e.db.Get(&want, state)
	waitFor(t, 60*time.Second, "the subscriber to hold what the source holds", func() bool {
		var got string
		sub.Get(&got, state)
		return got == want
	})
	sub.MustExec(`ALTER SUBSCRIPTION reconcile_switch DISABLE`)
	e.useAddr(subscriber.addr())

	p := cleanPasses(t, subURL, 3, true, "after the switch")
	if !strings.Contains(fmt.Sprint(p.checkpoint["broken"]), "another cluster") {
		t.Errorf("the first pass after the switch: %s; want it to say why the checkpoint was made anew", p)
	}
	applyAll(t, e, newTransfer(a, b, 2), newTransfer(c, a, 8), transition(first, "TransferFailed"))
	if p := periodicOn(t, subURL); p.code != 0 || p.pass != "periodic" || p.transfers != 3 {
		t.Errorf("after two creations and a failure applied on the subscriber: %s; want 0, a periodic pass over 3", p)
	}
	cleanPasses(t, subURL, 2, false, "after those were counted")
	if r, code := reconcileOn(t, subURL); code != 0 || count(r, "changed") != 0 {
		t.Errorf("a full pass (read only) on the subscriber: exit %d, drift %d, changed %d; want the transfers to sum to the balances and the checkpoint",
			code, count(r, "drift"), count(r, "changed"))
	}
}

// A failover to a streaming standby (the primary crashed, the standby
// promoted: a new timeline) keeps the checkpoint: it came with the
// transfers, on the same history of transaction ids, and the promoted
// server's counter goes on past every id the checkpoint names. The passes
// after the promotion start from it: the transfers after its cut-off, and
// those applied on the new primary, are each counted once, a drift put
// into one is found exactly, and a full pass agrees with the checkpoint.
func TestReconcileGoesOnFromItsCheckpointAfterAFailover(t *testing.T) {
	parallel(t) // on servers of its own
	primary := newPGCluster(t)
	admin := adminOf(t, primary)
	standby := standbyOf(primary, "standby1", primary.addr())
	streaming(t, admin, "standby1", "async")
	e := newEnvOn(t, primary.adminURL())
	a, b, c := "acc_a_"+e.name, "acc_b_"+e.name, "acc_c_"+e.name
	created := newTransfer(a, b, 10)
	applyAll(t, e, created, newTransfer(b, c, 4))
	if p := periodicOn(t, e.dbURL); p.code != 0 || p.pass != "full" {
		t.Fatalf("the first periodic pass: %s; want 0, a full one that makes the checkpoint", p)
	}
	applyAll(t, e, newTransfer(c, a, 3))
	cleanPasses(t, e.dbURL, 1, false, "before the failover")
	applyAll(t, e, newTransfer(a, c, 5), transition(created, "TransferFailed")) // after the cut-off
	caughtUp(t, admin, standby)
	promote(primary, standby)
	promotedURL := fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", standby.addr(), e.name)
	e.useAddr(standby.addr())
	waitFor(t, 60*time.Second, "the standby to be promoted", func() bool {
		var recovering bool
		return e.db.Get(&recovering, `SELECT pg_is_in_recovery()`) == nil && !recovering
	})

	if p := periodicOn(t, promotedURL); p.code != 0 || p.pass != "periodic" || p.transfers != 2 || p.drift != 0 {
		t.Fatalf("the first pass after the promotion: %s; want 0, a periodic pass from the checkpoint over the 2 transfers after its cut-off", p)
	}
	applyAll(t, e, newTransfer(c, b, 1), newTransfer(b, a, 9))
	if p := periodicOn(t, promotedURL); p.code != 0 || p.pass != "periodic" || p.transfers != 2 {
		t.Errorf("after two transfers on the new primary: %s; want 0, a periodic pass over 2", p)
	}
	if r, code := reconcileOn(t, promotedURL); code != 0 || count(r, "changed") != 0 {
		t.Errorf("a full pass (read only): exit %d, drift %d, changed %d; want the transfers to sum to the balances and the checkpoint",
			code, count(r, "drift"), count(r, "changed"))
	}
	late := newTransfer(b, c, 6)
	applyAll(t, e, late)
	e.db.MustExec(`UPDATE transfer SET amount_minor = 7 WHERE transfer_id = $1`, late.Data.TransferID)
	if p := periodicOn(t, promotedURL); p.code != 3 || p.pass != "periodic" || p.drift != 2 {
		t.Errorf("after a transfer on the new primary was changed: %s; want 3, a periodic pass, its 2 accounts in drift", p)
	}
}
