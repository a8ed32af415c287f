package reconcile

import (
	"context"
	"strings"
	"testing"
	"time"
)

// Transfers changed since the checkpoint: a finding kept until a person
// resolves it (adr/0007, sql/0020).

// changedAccounts returns the accounts of r's changed findings, in order.
func changedAccounts(r Reconciliation) string {
	var out []string
	for _, c := range r.Changed {
		out = append(out, c.Account)
	}
	return strings.Join(out, ",")
}

// A transfer the checkpoint counted, changed by hand together with its
// balances (so that no balance drifts), is found by the full pass that
// makes the checkpoint anew, which writes it down: every pass after it,
// periodic, full and read only, reports it, as it was found and since
// when, though the checkpoint made anew agrees with the transfers as they
// are. It stays until a person resolves it (reconcile_resolved, with
// why), and the finding itself is kept; a resolution must name a finding,
// and a finding resolved cannot be deleted. Putting the transfer back is
// a second edit, found against the checkpoint made anew: a finding of its
// own.
func TestAChangedFindingIsKeptUntilAPersonResolvesIt(t *testing.T) {
	database := testDB(t, 4)
	l := newLedger(t, database)
	old := l.create(0, 1, 100)
	l.create(1, 2, 30)
	pass(t, database, periodic)
	l.create(2, 0, 1)
	pass(t, database, periodic)
	var made time.Time
	database.Get(&made, `SELECT rebuilt_at FROM reconcile_checkpoint`)
	database.MustExec(`UPDATE transfer SET amount_minor = 90 WHERE transfer_id = $1`, old.Transfer.ID)
	database.MustExec(`UPDATE balance_projection SET balance_minor = balance_minor + 10 WHERE account = $1`, l.account(0))
	database.MustExec(`UPDATE balance_projection SET balance_minor = balance_minor - 10 WHERE account = $1`, l.account(1))

	full := PeriodicOptions{Options: periodic.Options, Full: true}
	want := l.account(0) + "," + l.account(1)
	r := pass(t, database, full)
	if !r.Checkpoint.Rebuilt || r.Checkpoint.Differs != 2 || r.DriftCount != 0 || r.ChangedCount != 2 || changedAccounts(r) != want {
		t.Fatalf("the full pass after the edit: rebuilt %v, differs %d, drift %d, changed %+v; want the checkpoint made anew, no drift, %s changed",
			r.Checkpoint.Rebuilt, r.Checkpoint.Differs, r.DriftCount, r.Changed, want)
	}
	c := r.Changed[0]
	if c.Difference != -10 || c.Transfers != -89 || c.Checkpoint == nil || *c.Checkpoint != -99 || c.FirstSeen == nil ||
		c.CheckpointMadeAt == nil || !c.CheckpointMadeAt.Equal(made) || c.CutoffAt == nil {
		t.Fatalf("%+v: want the transfers -89 where the checkpoint made at %s said -99, and since when", c, made)
	}
	seen := *c.FirstSeen
	for i, o := range []PeriodicOptions{periodic, periodic, full} {
		r := pass(t, database, o)
		if r.ChangedCount != 2 || changedAccounts(r) != want || !r.Changed[0].FirstSeen.Equal(seen) || r.Changed[0].Difference != -10 ||
			r.Checkpoint.Differs != 0 || r.OldestFinding == nil || !r.OldestFinding.Equal(seen) {
			t.Fatalf("pass %d after (full %v): changed %+v, differs %d, oldest %v; want the two kept as found, first seen %s",
				i+1, r.Full, r.Changed, r.Checkpoint.Differs, r.OldestFinding, seen)
		}
	}
	if r := fullPass(t, database); r.ChangedCount != 2 || changedAccounts(r) != want || r.Changed[0].FirstSeen == nil || r.Checkpoint.Differs != 0 {
		t.Errorf("the read-only full pass: changed %+v, differs %d; want the two kept", r.Changed, r.Checkpoint.Differs)
	}

	// A person resolves the first account's, with why.
	if _, err := database.Exec(`INSERT INTO reconcile_resolved (kind, subject, note) VALUES ('changed', 'no such finding', 'x')`); err == nil {
		t.Error("a resolution that names no finding was taken")
	}
	database.MustExec(`INSERT INTO reconcile_resolved (kind, subject, note)
		SELECT kind, subject, 'a refund booked by hand, ticket 42' FROM reconcile_finding WHERE kind = 'changed' AND detail->>'account' = $1`, l.account(0))
	if r := pass(t, database, periodic); r.ChangedCount != 1 || changedAccounts(r) != l.account(1) {
		t.Errorf("after a person resolved %s's: changed %+v; want %s's alone", l.account(0), r.Changed, l.account(1))
	}
	if _, err := database.Exec(`DELETE FROM reconcile_finding WHERE kind = 'changed'`); err == nil {
		t.Error("a changed finding a person resolved was deleted")
	}
	var kept int
	database.Get(&kept, `SELECT count(*) FROM reconcile_finding WHERE kind = 'changed'`)
	if kept != 2 {
		t.Errorf("%d changed findings in reconcile_finding, want the two, the resolved one too", kept)
	}

	// Put back: a second edit, against the checkpoint made anew since.
	database.MustExec(`UPDATE transfer SET amount_minor = 100 WHERE transfer_id = $1`, old.Transfer.ID)
	r = pass(t, database, full)
	if r.Checkpoint.Differs != 2 || r.ChangedCount != 3 {
		t.Errorf("the full pass after the transfer was put back: differs %d, changed %+v; want 2 found, 3 reported", r.Checkpoint.Differs, r.Changed)
	}
}

// The full pass on a standby only reads: it reports the accounts its
// comparison finds, and the primary keeps them (RecordFull), marking the
// checkpoint; the primary's next pass, which makes the checkpoint anew,
// finds the same against the same checkpoint and adds nothing; the
// standby's pass before that reports each once, kept or found.
func TestAChangedFindingFromAStandbyIsKeptOnce(t *testing.T) {
	database := testDB(t, 4)
	l := newLedger(t, database)
	old := l.create(0, 1, 100)
	l.create(1, 2, 30)
	pass(t, database, periodic)
	database.MustExec(`UPDATE transfer SET amount_minor = 95 WHERE transfer_id = $1`, old.Transfer.ID)

	read := fullPass(t, database)
	if read.Checkpoint.Differs != 2 || read.ChangedCount != 2 || read.Changed[0].FirstSeen != nil || read.Changed[0].CheckpointMadeAt == nil {
		t.Fatalf("the read-only pass: differs %d, changed %+v; want the two found, not yet kept", read.Checkpoint.Differs, read.Changed)
	}
	if err := RecordFull(context.Background(), database, read); err != nil {
		t.Fatal(err)
	}
	again := fullPass(t, database)
	if again.Checkpoint.Differs != 2 || again.ChangedCount != 2 || again.Changed[0].FirstSeen == nil {
		t.Errorf("the read-only pass after they were kept: differs %d, changed %+v; want the two, kept, each once", again.Checkpoint.Differs, again.Changed)
	}
	r := pass(t, database, periodic)
	if !r.Full || r.Checkpoint.Distrusted == "" || r.ChangedCount != 2 || r.Checkpoint.Differs != 2 {
		t.Errorf("the primary's pass: full %v, distrusted %q, differs %d, changed %+v; want a full one, the two found again and kept once",
			r.Full, r.Checkpoint.Distrusted, r.Checkpoint.Differs, r.Changed)
	}
	if r := pass(t, database, periodic); r.Full || r.ChangedCount != 2 {
		t.Errorf("the pass after: full %v, changed %d; want a periodic one reporting the two", r.Full, r.ChangedCount)
	}
}
