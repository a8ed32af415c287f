package reconcile

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"transferconsumer/db"
	"transferconsumer/event"
)

// The periodic pass (adr/0007): from a checkpoint, the transfers since its
// cut-off, and the full pass beside it.

var periodic = PeriodicOptions{Options: Options{Window: time.Hour, PendingAfter: time.Hour, Limit: 20, Exclusive: true}}

// pass runs one periodic pass and fails the test on an error or when it
// did not run.
func pass(t *testing.T, database *sqlx.DB, o PeriodicOptions) Reconciliation {
	t.Helper()
	r, err := Periodic(context.Background(), database, o)
	if err != nil || !r.Ran || !r.Recorded {
		t.Fatalf("periodic pass: ran %v, recorded %v, %v", r.Ran, r.Recorded, err)
	}
	return r
}

// fullPass runs the read-only full pass.
func fullPass(t *testing.T, database *sqlx.DB) Reconciliation {
	t.Helper()
	r, err := Full(context.Background(), database, periodic.Options)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// ledger applies transfers between accounts of its own, one event per
// transaction, as the service does.
type ledger struct {
	t        *testing.T
	database *sqlx.DB
	prefix   string
	n        int
}

func newLedger(t *testing.T, database *sqlx.DB) *ledger {
	return &ledger{t: t, database: database, prefix: "acc_" + newID()[:8] + "_"}
}

func (l *ledger) account(i int) string { return l.prefix + string(rune('a'+i)) }

// create applies a TransferCreated of amount from account i to account j,
// and returns its event.
func (l *ledger) create(i, j int, amount int64) event.Event {
	l.t.Helper()
	ev := newEvent(l.t, newID(), event.TransferCreated, newID(), l.account(i), l.account(j), amount)
	l.apply(ev)
	return ev
}

// fail applies a TransferFailed of the transfer ev created.
func (l *ledger) fail(ev event.Event) {
	l.t.Helper()
	t := ev.Transfer
	l.apply(newEvent(l.t, newID(), event.TransferFailed, t.ID, t.FromAccount, t.ToAccount, t.AmountMinor))
}

func (l *ledger) apply(ev event.Event) {
	l.t.Helper()
	if _, err := db.NewInbox(l.database).Apply(context.Background(), ev); err != nil {
		l.t.Fatal(err)
	}
}

func driftAccounts(r Reconciliation) []string {
	var out []string
	for _, d := range r.Drift {
		out = append(out, d.Account)
	}
	return out
}

// The first pass has no checkpoint and is a full one, which makes it; the
// next adds only what came since, and a drift put into a transfer written
// after the cut-off is found by the next periodic pass, on both its
// accounts, and reported until it is mended.
func TestAPeriodicPassFindsADriftWrittenAfterTheCutoff(t *testing.T) {
	database := testDB(t, 4)
	l := newLedger(t, database)
	for i := range 6 {
		l.create(i%3, (i+1)%3, int64(10+i))
	}
	l.fail(l.create(0, 2, 7))
	first := pass(t, database, periodic)
	if !first.Full || !first.Checkpoint.Rebuilt || first.Checkpoint.Broken != "there is none" || first.Checkpoint.Distrusted != "" || first.DriftCount != 0 {
		t.Fatalf("first pass: full %v, rebuilt %v, broken %q, distrusted %q, drift %d; want a full pass that makes the checkpoint, clean",
			first.Full, first.Checkpoint.Rebuilt, first.Checkpoint.Broken, first.Checkpoint.Distrusted, first.DriftCount)
	}
	l.create(1, 2, 40)
	failing := l.create(2, 0, 9)
	pass(t, database, periodic)
	l.fail(failing) // created before the cut-off, failed after it
	l.fail(l.create(2, 0, 8))
	r := pass(t, database, periodic)
	if r.Full || r.Transfers != 2 || r.DriftCount != 0 {
		t.Fatalf("third pass: full %v, %d transfers since the cut-off, drift %v; want a periodic pass over 2 (a creation, a failure), clean",
			r.Full, r.Transfers, r.Drift)
	}
	again := l.create(1, 2, 3)
	database.MustExec(`UPDATE transfer SET amount_minor = amount_minor + 5 WHERE transfer_id = $1`, again.Transfer.ID)
	r = pass(t, database, periodic)
	if r.Full || r.DriftCount != 2 || strings.Join(driftAccounts(r), ",") != l.account(1)+","+l.account(2) {
		t.Fatalf("after a transfer written since was changed: full %v, drift %+v; want %s and %s", r.Full, r.Drift, l.account(1), l.account(2))
	}
	for _, d := range r.Drift {
		if d.Difference != map[string]int64{l.account(1): 5, l.account(2): -5}[d.Account] || d.FirstSeen == nil {
			t.Errorf("%+v: want a difference of ±5 and when it was first seen", d)
		}
	}
	seen := *r.Drift[0].FirstSeen
	r = pass(t, database, periodic)
	if r.DriftCount != 2 || !r.Drift[0].FirstSeen.Equal(seen) {
		t.Errorf("the next pass, with nothing new: drift %+v; want the same two, first seen at %s", r.Drift, seen)
	}
	database.MustExec(`UPDATE transfer SET amount_minor = amount_minor - 5 WHERE transfer_id = $1`, again.Transfer.ID)
	if r = pass(t, database, periodic); r.DriftCount != 2 {
		t.Errorf("a row in the checkpoint mended by hand: drift %d, want the two still (the checkpoint holds it changed)", r.DriftCount)
	}
	if r = pass(t, database, PeriodicOptions{Options: periodic.Options, Full: true}); r.DriftCount != 0 || !r.Full {
		t.Errorf("a full pass after the mend: drift %+v; want none", r.Drift)
	}
	if r = pass(t, database, periodic); r.Full || r.DriftCount != 0 {
		t.Errorf("the periodic pass after it: full %v, drift %+v; want none", r.Full, r.Drift)
	}
}

// A transfer the checkpoint already holds, changed by hand, is beyond the
// periodic pass; the full pass finds it: its accounts drift from their
// balances, and their transfers no longer sum to what the checkpoint says.
// A full pass that makes the checkpoint anew records both, which the
// periodic passes then report: the drift until it is mended, the change
// until a person resolves it (TestAChangedFindingIsKeptUntilAPersonResolvesIt).
// A balance changed by hand is found by the sweep.
func TestAnOldRowChangedByHandIsFoundByTheFullPass(t *testing.T) {
	database := testDB(t, 4)
	l := newLedger(t, database)
	old := l.create(0, 1, 100)
	l.create(1, 2, 30)
	pass(t, database, periodic)
	l.create(2, 0, 1)
	pass(t, database, periodic)
	database.MustExec(`UPDATE transfer SET amount_minor = 90 WHERE transfer_id = $1`, old.Transfer.ID)

	if r := pass(t, database, periodic); r.Full || r.DriftCount != 0 {
		t.Fatalf("periodic pass: full %v, drift %+v; this test expects the change beyond it", r.Full, r.Drift)
	}
	full := fullPass(t, database)
	want := l.account(0) + "," + l.account(1)
	if full.DriftCount != 2 || strings.Join(driftAccounts(full), ",") != want {
		t.Errorf("full pass: drift %+v; want %s", full.Drift, want)
	}
	if !full.Checkpoint.Compared || full.ChangedCount != 2 || full.Changed[0].Account != l.account(0) || full.Changed[0].Difference != -10 {
		t.Errorf("full pass: compared %v, changed %+v; want %s's transfers 10 less than the checkpoint says", full.Checkpoint.Compared, full.Changed, want)
	}
	rebuilt := pass(t, database, PeriodicOptions{Options: periodic.Options, Full: true})
	if rebuilt.DriftCount != 2 || rebuilt.ChangedCount != 2 || !rebuilt.Checkpoint.Rebuilt {
		t.Errorf("full pass that records: drift %d, changed %d, rebuilt %v; want 2, 2, true", rebuilt.DriftCount, rebuilt.ChangedCount, rebuilt.Checkpoint.Rebuilt)
	}
	if r := pass(t, database, periodic); r.Full || r.DriftCount != 2 || r.ChangedCount != 2 {
		t.Errorf("the periodic pass after: full %v, drift %d, changed %d; want the two drifts and the two changed reported still", r.Full, r.DriftCount, r.ChangedCount)
	}
	database.MustExec(`UPDATE transfer SET amount_minor = 100 WHERE transfer_id = $1`, old.Transfer.ID)
	pass(t, database, PeriodicOptions{Options: periodic.Options, Full: true})

	// A balance no transfer since moved, changed by hand: the sweep
	// compares every balance within a round (here two passes of two).
	database.MustExec(`UPDATE balance_projection SET balance_minor = balance_minor + 1 WHERE account = $1`, l.account(2))
	sweep := PeriodicOptions{Options: periodic.Options, Sweep: 2}
	found := 0
	for range 3 {
		if r := pass(t, database, sweep); r.DriftCount > 0 {
			found++
			if d := r.Drift[0]; d.Account != l.account(2) || d.Difference != 1 {
				t.Errorf("drift %+v; want %s, +1", d, l.account(2))
			}
		}
	}
	if found < 2 {
		t.Errorf("the balance changed by hand was reported by %d of 3 passes sweeping two accounts each, want at least 2", found)
	}
}

// Two creations of one intent, one before the cut-off and one after, are
// found by the periodic pass: in commit order as in creation order, and
// also when the earlier creation's transaction began before the later's
// but committed after the cut-off (a time or an id would put it before).
// A pair found is reported until a person dismisses it, or one of its
// transfers fails; a transition waiting too long, until its creation
// comes.
func TestDuplicateIntentsThatStraddleTheCutoffAreFound(t *testing.T) {
	database := testDB(t, 4)
	l := newLedger(t, database)
	first := l.create(0, 1, 700)
	pass(t, database, periodic)
	second := l.create(0, 1, 700)
	r := pass(t, database, periodic)
	if r.Full || r.DupCount != 1 || r.Duplicates[0].Transfer != second.Transfer.ID || r.Duplicates[0].Earlier != first.Transfer.ID {
		t.Fatalf("full %v, duplicates %+v; want %s repeating %s", r.Full, r.Duplicates, second.Transfer.ID, first.Transfer.ID)
	}
	if r = pass(t, database, periodic); r.DupCount != 1 {
		t.Errorf("the pass after: %d duplicates, want the one still", r.DupCount)
	}
	database.MustExec(`INSERT INTO reconcile_dismissed (transfer_id, note) VALUES ($1, 'meant')`, second.Transfer.ID)
	if r = pass(t, database, periodic); r.DupCount != 0 {
		t.Errorf("after the dismissal: %+v, want none", r.Duplicates)
	}

	// The earlier creation's transaction began before the cut-off and
	// commits after it: the pass must count it then, though its
	// created_at is before the cut-off's time.
	ctx := context.Background()
	early := newEvent(t, newID(), event.TransferCreated, newID(), l.account(2), l.account(3), 55)
	tx, err := database.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var outcome string
	if err := applyIn(ctx, tx, &outcome, early); err != nil || outcome != "applied" {
		t.Fatalf("apply in an open transaction: %q, %v", outcome, err)
	}
	if r = pass(t, database, periodic); r.DupCount != 0 || r.DriftCount != 0 {
		t.Fatalf("with the earlier creation not committed: duplicates %+v, drift %+v; want none", r.Duplicates, r.Drift)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	later := l.create(2, 3, 55)
	r = pass(t, database, periodic)
	if r.DupCount != 1 || r.Duplicates[0].Transfer != later.Transfer.ID || r.Duplicates[0].Earlier != early.Transfer.ID {
		t.Errorf("after the commit: %+v; want %s repeating %s", r.Duplicates, later.Transfer.ID, early.Transfer.ID)
	}
	if r.DriftCount != 0 {
		t.Errorf("drift %+v: the creation committed after the cut-off was counted wrong", r.Drift)
	}
	l.fail(later)
	if r = pass(t, database, periodic); r.DupCount != 0 {
		t.Errorf("after the later one failed: %+v, want none", r.Duplicates)
	}

	// A transition waiting too long is reported in the same way, by every
	// pass until its creation comes.
	id := newID()
	l.apply(newEvent(t, newID(), event.TransferCompleted, id, l.account(4), l.account(5), 4))
	database.MustExec(`UPDATE pending_transition SET received_at = now() - interval '2 hours' WHERE transfer_id = $1`, id)
	for range 2 {
		if r := pass(t, database, periodic); r.WaitCount != 1 || r.Waiting[0].Transfer != id || r.Waiting[0].FirstSeen == nil {
			t.Fatalf("waiting %+v; want %s", r.Waiting, id)
		}
	}
	l.apply(newEvent(t, newID(), event.TransferCreated, id, l.account(4), l.account(5), 4))
	if r := pass(t, database, periodic); r.WaitCount != 0 || r.DriftCount != 0 {
		t.Errorf("after the creation: waiting %+v, drift %+v; want none", r.Waiting, r.Drift)
	}
}

// Transactions that commit across the cut-offs of passes running beside
// them (each opened before a pass, committed after it) are each counted
// once: no pass sees drift, and a full pass at the end agrees.
func TestTransactionsAcrossTheCutoffAreCountedOnce(t *testing.T) {
	database := testDB(t, 8)
	l := newLedger(t, database)
	pass(t, database, periodic)
	ctx := context.Background()
	const workers, rounds = 4, 6
	for round := range rounds {
		// Each worker's transfer between accounts of its own (the balance
		// rows it locks), from w to w+4; the one committed before the
		// pass, between 8 and 9.
		var evs []event.Event
		for w := range workers {
			evs = append(evs, newEvent(t, newID(), event.TransferCreated, newID(), l.account(w), l.account(w+workers), int64(100*round+w+1)))
		}
		var open sync.WaitGroup
		commit := make(chan struct{})
		errs := make(chan error, workers)
		var done sync.WaitGroup
		for _, ev := range evs {
			open.Add(1)
			done.Add(1)
			go func() {
				defer done.Done()
				tx, err := database.BeginTxx(ctx, nil)
				if err != nil {
					open.Done()
					errs <- err
					return
				}
				defer tx.Rollback()
				var outcome string
				err = applyIn(ctx, tx, &outcome, ev)
				open.Done()
				if err != nil {
					errs <- err
					return
				}
				<-commit
				errs <- tx.Commit()
			}()
		}
		open.Wait()
		// Committed before the pass, while the workers' transactions are
		// open: their ids are above the cut-off's xmin, yet they are in
		// the checkpoint.
		l.create(8, 9, int64(3+round))
		l.fail(l.create(9, 8, 2))
		if r := pass(t, database, periodic); r.DriftCount != 0 {
			t.Fatalf("round %d, transactions open: drift %+v", round, r.Drift)
		}
		close(commit)
		done.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if r := pass(t, database, periodic); r.DriftCount != 0 || r.Full {
			t.Fatalf("round %d, after the commits: full %v, drift %+v", round, r.Full, r.Drift)
		}
	}
	if full := fullPass(t, database); full.DriftCount != 0 || full.ChangedCount != 0 || !full.Checkpoint.Compared {
		t.Errorf("full pass at the end: drift %+v, changed %+v, compared %v", full.Drift, full.Changed, full.Checkpoint.Compared)
	}
}

// Each pass finds duplicate intents by the one definition
// (intentPairsSQL): the periodic pass over the recent transfers, the
// read-only full pass and the rebuild over all of them find the same
// pair, and none of them a retry after a failure or a pair a person
// dismissed.
func TestEveryPassFindsTheSameDuplicateIntents(t *testing.T) {
	database := testDB(t, 4)
	l := newLedger(t, database)
	pass(t, database, periodic) // the checkpoint
	first, second := l.create(0, 1, 25), l.create(0, 1, 25)
	l.fail(l.create(1, 2, 30))
	l.create(1, 2, 30)
	l.create(2, 3, 40)
	dismissed := l.create(2, 3, 40)
	database.MustExec(`INSERT INTO reconcile_dismissed (transfer_id, note) VALUES ($1, 'two payments')`, dismissed.Transfer.ID)
	pairs := func(r Reconciliation) string {
		var out []string
		for _, d := range r.Duplicates {
			out = append(out, d.Transfer+" repeats "+d.Earlier)
		}
		return fmt.Sprintf("%d: %s", r.DupCount, strings.Join(out, ", "))
	}
	want := "1: " + second.Transfer.ID + " repeats " + first.Transfer.ID
	if got := pairs(pass(t, database, periodic)); got != want {
		t.Errorf("the periodic pass: %s, want %s", got, want)
	}
	if got := pairs(fullPass(t, database)); got != want {
		t.Errorf("the read-only full pass: %s, want %s", got, want)
	}
	rebuild := periodic
	rebuild.Full = true
	if r := pass(t, database, rebuild); !r.Full || pairs(r) != want {
		t.Errorf("the rebuild: full %v, %s, want %s", r.Full, pairs(r), want)
	}
}
