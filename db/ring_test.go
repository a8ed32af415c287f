package db

import (
	"context"
	"testing"
	"time"

	"transferconsumer/event"
)

// A redelivery whose original claim sits in an older slot of the ring is
// a duplicate, alone and in a batch, and the same id with other content
// is a producer conflict: the claim looks in every slot, not only its own.
func TestClaimFindsItsOriginalInAnOlderSlot(t *testing.T) {
	database := testDB(t, 2)
	ctx := context.Background()
	in := NewInbox(database)
	ev := newEvent(t, newID(), event.TransferCreated, newID(), "acc_a", "acc_b", 100)
	database.MustExec(`INSERT INTO processed_event (event_id, event_type, processed_at, fingerprint, slot)
		VALUES ($1, $2, `+dayAt("$3")+`, $4, inbox_slot(`+dayAt("$3")+`))`, ev.ID, ev.Type, 5, ev.Fingerprint)
	if r, err := in.Apply(ctx, ev); err != nil || !r.Duplicate {
		t.Errorf("the event claimed 5 days ago, again = %+v, %v; want a duplicate", r, err)
	}
	l := in.Lane(0).(*lane)
	defer l.Close()
	other := newEvent(t, newID(), event.TransferCreated, newID(), "acc_a", "acc_c", 7)
	out, err := l.ApplyBatch(ctx, []event.Event{other, ev})
	if err != nil || len(out) != 2 || out[0].Err != nil || out[0].Result.Duplicate || out[1].Err != nil || !out[1].Result.Duplicate {
		t.Errorf("a batch of a new event and the old one = %+v, %v; want applied, duplicate", out, err)
	}
	changed := newEvent(t, ev.ID, event.TransferCreated, newID(), "acc_a", "acc_b", 999)
	if _, err := in.Apply(ctx, changed); event.ClassOf(ctx, err) != event.ClassConflict {
		t.Errorf("the same id with other content = %v; want a producer conflict", err)
	}
	var rows int
	database.Get(&rows, `SELECT count(*) FROM processed_event WHERE event_id = $1`, ev.ID)
	if rows != 1 {
		t.Errorf("%d inbox rows of the event, want its one", rows)
	}
	var balance int64
	database.Get(&balance, `SELECT coalesce(sum(balance_minor), 0) FROM balance_projection WHERE account = 'acc_b'`)
	if balance != 0 {
		t.Errorf("acc_b's balance %d: the duplicate moved money", balance)
	}
}

// The claim is one critical section: a claim of an id whose advisory lock
// another transaction holds waits, and then sees what that transaction
// committed, whichever slot it wrote to. The other transaction here
// writes the id into a slot of five days ago, which no unique index shares
// with today's: without the lock, the claim would find nothing and apply
// the event a second time.
func TestClaimWaitsForTheIdsLockThenSeesItsCommit(t *testing.T) {
	database := testDB(t, 4)
	ctx := context.Background()
	in := NewInbox(database)
	for _, batch := range []bool{false, true} {
		ev := newEvent(t, newID(), event.TransferCreated, newID(), "acc_a", "acc_b", 100)
		holder, err := database.BeginTxx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		holder.MustExec(`SELECT pg_advisory_xact_lock(inbox_key($1))`, ev.ID)
		done := make(chan event.Result, 1)
		go func() {
			var r event.Result
			var err error
			if batch {
				l := in.Lane(0).(*lane)
				defer l.Close()
				var out []event.Outcome
				out, err = l.ApplyBatch(ctx, []event.Event{ev, newEvent(t, newID(), event.TransferCreated, newID(), "acc_c", "acc_d", 1)})
				if err == nil {
					r, err = out[0].Result, out[0].Err
				}
			} else {
				r, err = in.Apply(ctx, ev)
			}
			if err != nil {
				t.Errorf("apply (batch %v): %v", batch, err)
			}
			done <- r
		}()
		waitFor(t, 10*time.Second, "the claim to wait for the id's lock", func() bool {
			var waiting int
			database.Get(&waiting, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
			return waiting == 1
		})
		holder.MustExec(`INSERT INTO processed_event (event_id, event_type, processed_at, fingerprint, slot)
			VALUES ($1, $2, `+dayAt("$3")+`, $4, inbox_slot(`+dayAt("$3")+`))`, ev.ID, ev.Type, 5, ev.Fingerprint)
		if err := holder.Commit(); err != nil {
			t.Fatal(err)
		}
		if r := <-done; !r.Duplicate {
			t.Errorf("batch %v: the claim after the holder's commit = %+v; want a duplicate", batch, r)
		}
	}
	var balance int64
	database.Get(&balance, `SELECT coalesce(sum(balance_minor), 0) FROM balance_projection WHERE account = 'acc_b'`)
	if balance != 0 {
		t.Errorf("acc_b's balance %d: an event claimed in another slot was applied again", balance)
	}
}
