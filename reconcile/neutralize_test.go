package reconcile

import (
	"context"
	"strings"
	"testing"
	"time"

	"transferconsumer/event"
)

// Transaction ids of another cluster (adr/0007): what a dump restored into
// a cluster made anew, or logical replication, leaves in the transfers.

// restored writes a transfer from account i to j as a restore from another
// cluster leaves it: its row with the id of the transaction that made it
// there (xid), and the balances it moved; failed, with its failure's row,
// when failedXid is not 0. It returns the TransferCreated that made it.
func (l *ledger) restored(i, j int, amount, xid, failedXid int64) event.Event {
	l.t.Helper()
	ev := newEvent(l.t, newID(), event.TransferCreated, newID(), l.account(i), l.account(j), amount)
	state, moved := "created", amount
	if failedXid != 0 {
		state, moved = "failed", 0
	}
	l.database.MustExec(`
WITH t AS (
    INSERT INTO transfer (transfer_id, from_account, to_account, amount_minor, currency, state, created_event_id, created_xid)
    VALUES ($1, $2, $3, $4, 'EUR', $5, $6, $7)
)
INSERT INTO balance_projection AS b (account, balance_minor) VALUES ($2, -$8::bigint), ($3, $8::bigint)
ON CONFLICT (account) DO UPDATE SET balance_minor = b.balance_minor + EXCLUDED.balance_minor`,
		ev.Transfer.ID, ev.Transfer.FromAccount, ev.Transfer.ToAccount, amount, state, ev.ID, xid, moved)
	if failedXid != 0 {
		l.database.MustExec(`INSERT INTO transfer_failure (transfer_id, from_account, to_account, amount_minor, created_xid, failed_xid)
			VALUES ($1, $2, $3, $4, $5, $6)`, ev.Transfer.ID, ev.Transfer.FromAccount, ev.Transfer.ToAccount, amount, xid, failedXid)
	}
	return ev
}

// aheadXid is a transaction id a billion above this cluster's: one a
// cluster that has run longer gave.
func aheadXid(t *testing.T, database interface {
	Get(any, string, ...any) error
}) int64 {
	t.Helper()
	var xid int64
	if err := database.Get(&xid, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint + 1000000000`); err != nil {
		t.Fatal(err)
	}
	return xid
}

// createdXid reads the created_xid of the transfer ev made (nil: NULL).
func createdXid(t *testing.T, l *ledger, ev event.Event) *int64 {
	t.Helper()
	var xid *int64
	if err := l.database.Get(&xid, `SELECT created_xid FROM transfer WHERE transfer_id = $1`, ev.Transfer.ID); err != nil {
		t.Fatal(err)
	}
	return xid
}

// Transfers restored from another cluster, whose ids are far above this
// one's, would look committed after every cut-off, and be added to the
// checkpoint by every pass. The first pass neutralizes them (and a
// failure's), forgets the checkpoint and makes it anew, without comparing
// the transfers with it; the passes after find nothing, and count what is
// applied here once. An id of the other cluster that this one's snapshots
// already see is left as it is.
func TestAPassNeutralizesTransactionIdsOfAnotherCluster(t *testing.T) {
	database := testDB(t, 4)
	l := newLedger(t, database)
	seen := l.restored(3, 1, 5, 3, 0) // this cluster's snapshots see id 3
	l.create(0, 1, 10)
	l.fail(l.create(1, 2, 4))
	pass(t, database, periodic)
	ahead := aheadXid(t, database)
	restoredOnes := []event.Event{l.restored(2, 0, 30, ahead, 0), l.restored(0, 3, 8, ahead+1, ahead+2), l.restored(1, 0, 6, ahead+3, 0)}

	var first Reconciliation
	for i := range 4 {
		r := pass(t, database, periodic)
		if r.DriftCount != 0 || r.ChangedCount != 0 || r.Full != (i == 0) || i > 0 && (r.Transfers != 0 || r.Checkpoint.Neutralized != 0) {
			t.Errorf("pass %d after the restore: full %v, %d transfers, drift %+v, changed %d, neutralized %d; "+
				"want nothing found, the first a full pass, then periodic ones over no transfer",
				i+1, r.Full, r.Transfers, r.Drift, r.ChangedCount, r.Checkpoint.Neutralized)
		}
		if i == 0 {
			first = r
		}
	}
	if c := first.Checkpoint; c.Neutralized != 4 || !c.Rebuilt || c.Compared || !strings.Contains(c.Broken, "another cluster") {
		t.Errorf("the first pass after the restore: neutralized %d, rebuilt %v, compared %v, broken %q; "+
			"want 4 rows (3 transfers, 1 failure), the checkpoint made anew without comparing, saying why",
			c.Neutralized, c.Rebuilt, c.Compared, c.Broken)
	}
	for _, ev := range restoredOnes {
		if xid := createdXid(t, l, ev); xid != nil {
			t.Errorf("transfer %s: created_xid %d, want NULL", ev.Transfer.ID, *xid)
		}
	}
	if xid := createdXid(t, l, seen); xid == nil || *xid != 3 {
		t.Errorf("the transfer whose id this cluster sees: created_xid %v, want 3, left alone", xid)
	}
	var failure struct {
		Created *int64 `db:"created_xid"`
		Failed  int64  `db:"failed_xid"`
	}
	database.Get(&failure, `SELECT created_xid, failed_xid FROM transfer_failure WHERE transfer_id = $1`, restoredOnes[1].Transfer.ID)
	if failure.Created != nil || failure.Failed != 0 {
		t.Errorf("the restored failure: %+v, want created_xid NULL and failed_xid 0", failure)
	}

	// Applied here: a creation, and the failure of a restored transfer.
	l.create(2, 3, 7)
	l.fail(restoredOnes[2])
	if r := pass(t, database, periodic); r.Full || r.Transfers != 2 || r.DriftCount != 0 {
		t.Errorf("after a creation and a failure applied here: full %v, %d transfers, drift %+v; want a periodic pass over 2, clean",
			r.Full, r.Transfers, r.Drift)
	}
	if r := pass(t, database, periodic); r.Transfers != 0 || r.DriftCount != 0 {
		t.Errorf("the pass after: %d transfers, drift %+v; want none", r.Transfers, r.Drift)
	}
	if full := fullPass(t, database); full.DriftCount != 0 || full.ChangedCount != 0 || !full.Checkpoint.Compared {
		t.Errorf("full pass at the end: drift %+v, changed %+v, compared %v", full.Drift, full.Changed, full.Checkpoint.Compared)
	}
}

// The neutralization never takes a transfer of this cluster for another
// cluster's: a creation still in flight while it runs is not visible to
// it, and is counted once by the pass after its commit, with its own id;
// a restored transfer whose row another transaction holds (a failure
// being applied) is neutralized once that transaction commits, as the row
// is then, and the failure's row, which copied its id, with it.
func TestNeutralizingLeavesTransactionsInFlightAlone(t *testing.T) {
	database := testDB(t, 6)
	l := newLedger(t, database)
	l.create(0, 1, 10)
	pass(t, database, periodic)
	ctx := context.Background()

	inFlight := newEvent(t, newID(), event.TransferCreated, newID(), l.account(2), l.account(3), 11)
	tx := database.MustBeginTx(ctx, nil)
	defer tx.Rollback()
	var outcome string
	if err := applyIn(ctx, tx, &outcome, inFlight); err != nil || outcome != "applied" {
		t.Fatalf("apply in an open transaction: %q, %v", outcome, err)
	}
	var inFlightXid int64
	tx.GetContext(ctx, &inFlightXid, `SELECT pg_current_xact_id()::text::bigint`)
	l.restored(1, 0, 4, aheadXid(t, database), 0)
	if r := pass(t, database, periodic); r.Checkpoint.Neutralized != 1 || !r.Full || r.DriftCount != 0 {
		t.Fatalf("with a creation in flight: neutralized %d, full %v, drift %+v; want the restored transfer alone, a full pass, clean",
			r.Checkpoint.Neutralized, r.Full, r.Drift)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if r := pass(t, database, periodic); r.Full || r.Transfers != 1 || r.DriftCount != 0 || r.Checkpoint.Neutralized != 0 {
		t.Fatalf("after its commit: full %v, %d transfers, drift %+v, neutralized %d; want a periodic pass over it, clean",
			r.Full, r.Transfers, r.Drift, r.Checkpoint.Neutralized)
	}
	if xid := createdXid(t, l, inFlight); xid == nil || *xid != inFlightXid {
		t.Errorf("the creation that was in flight: created_xid %v, want its own transaction's, %d", xid, inFlightXid)
	}

	// A failure of a restored transfer, applied in a transaction that
	// holds its row while the pass neutralizes.
	held := l.restored(3, 0, 9, aheadXid(t, database), 0)
	failing := database.MustBeginTx(ctx, nil)
	defer failing.Rollback()
	if err := applyIn(ctx, failing, &outcome, newEvent(t, newID(), event.TransferFailed, held.Transfer.ID, held.Transfer.FromAccount, held.Transfer.ToAccount, 9)); err != nil || outcome != "applied" {
		t.Fatalf("apply the failure in an open transaction: %q, %v", outcome, err)
	}
	done := make(chan Reconciliation, 1)
	errs := make(chan error, 1)
	go func() {
		r, err := Periodic(ctx, database, periodic)
		errs <- err
		done <- r
	}()
	waitFor(t, 10*time.Second, "the neutralization to wait for the row the failure holds", func() bool {
		var waiting bool
		database.Get(&waiting, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%UPDATE transfer t SET created_xid = NULL%')`)
		return waiting
	})
	if err := failing.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.Checkpoint.Neutralized != 2 || !r.Full || r.DriftCount != 0 {
		t.Errorf("the pass that waited: neutralized %d, full %v, drift %+v; want the transfer and its failure's row, a full pass, clean",
			r.Checkpoint.Neutralized, r.Full, r.Drift)
	}
	for i := range 2 {
		if r := pass(t, database, periodic); r.Full || r.DriftCount != 0 || r.Checkpoint.Neutralized != 0 {
			t.Errorf("pass %d after: full %v, drift %+v, neutralized %d; want a periodic pass, clean", i+1, r.Full, r.Drift, r.Checkpoint.Neutralized)
		}
	}
	if full := fullPass(t, database); full.DriftCount != 0 || full.ChangedCount != 0 {
		t.Errorf("full pass at the end: drift %+v, changed %+v", full.Drift, full.Changed)
	}
}
