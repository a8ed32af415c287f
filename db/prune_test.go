package db

import (
	"context"
	"testing"
	"time"
)

// Retention's lock lives only as long as a batch's transaction (the rows'
// ids sort after 2100, where retention deletes rows one by one, adr/0011): a run
// leaves no advisory lock behind on any session, and a run that finds the
// lock held (another replica's batch in progress) does nothing.
func TestPruneTakesTurnsAndLeavesNoLock(t *testing.T) {
	database := testDB(t, 4)
	ctx := context.Background()
	database.MustExec(`INSERT INTO processed_event (event_id, event_type, processed_at, fingerprint)
		SELECT ('f' || substr(gen_random_uuid()::text, 2))::uuid, 'TransferCreated', now() - interval '800 hours', '\x00'
		FROM generate_series(1, 25)`)

	other, err := database.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	other.MustExec(`SELECT pg_advisory_xact_lock($1)`, pruneLock)
	res, err := Prune(ctx, database, 720*time.Hour, 10)
	if err != nil || res.Ran || res.Deleted != 0 {
		t.Errorf("with the lock held elsewhere, Prune = %+v, %v; want nothing done", res, err)
	}
	other.Rollback()

	res, err = Prune(ctx, database, 720*time.Hour, 10)
	if err != nil || !res.Ran || res.Deleted != 25 || res.Batches != 3 {
		t.Errorf("Prune = %+v, %v; want 25 rows deleted in 3 batches", res, err)
	}
	var held int
	if err := database.Get(&held, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = $1`, pruneLock); err != nil || held != 0 {
		t.Errorf("%d prune locks held after the run (%v), want 0", held, err)
	}
}
