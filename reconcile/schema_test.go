package reconcile

import (
	"context"
	"os"
	"testing"

	"transferconsumer/db"
	"transferconsumer/dbtest"
)

// The passes need no privilege beyond what db.Grant gives the service's
// role on a locked-down database: they write the reconciliation's tables
// and fill its working sets, twice: the first makes the checkpoint, the
// second starts from it.
func TestThePassesNeedNoPrivilegeBeyondTheServiceRoles(t *testing.T) {
	ctx := context.Background()
	dbURL := dbtest.Create(t)
	owner, err := db.Open(ctx, dbURL, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Close() })
	if _, err := db.Migrate(ctx, owner, os.DirFS("../sql")); err != nil {
		t.Fatal(err)
	}
	role, svc := dbtest.ServiceRole(t, dbURL, owner)
	dbtest.LockDown(t, owner)
	if err := db.Grant(ctx, owner, role); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if r, err := Periodic(ctx, svc, periodic); err != nil || !r.Recorded || r.Full != (i == 0) {
			t.Errorf("periodic pass %d as %s: recorded %v, full %v, %v", i+1, role, r.Recorded, r.Full, err)
		}
	}
}

// The BRIN indexes of the periodic reconciliation (sql/0016) leave the
// range being filled without a summary, so that an insert there writes
// nothing to them: brin_summarize_new_values finds it to summarize (1),
// where a range CREATE INDEX summarized would give 0.
func TestTheRangeBeingFilledHasNoSummary(t *testing.T) {
	database := testDB(t, 2)
	l := newLedger(t, database)
	l.fail(l.create(0, 1, 5))
	for _, index := range []string{"transfer_created_range", "transfer_failure_range"} {
		var n int
		if err := database.Get(&n, `SELECT brin_summarize_new_values($1::regclass)`, index); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("%s: %d range(s) to summarize after the migration and an insert, want the one being filled", index, n)
		}
	}
}
