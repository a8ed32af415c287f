package integration

import (
	"archive/zip"
	"context"
	"os"
	"testing"
	"time"

	"transferconsumer/db"
)

// A deployment with a full inbox in the layout before its partitions (main
// at 57e6533: the migrations and function files as released then, kept
// packed) moves to the partitioned inbox while events flow, with no moment
// in which a duplicate gets through (adr/0011). The migration is made to wait behind
// a lock the test holds on the old inbox, as a claim in flight holds it;
// events, and duplicates of events applied before, arrive and wait behind
// the migration; the test sees a claim wait, lets go, and after the
// migration sends every event applied before it again. Each is a
// duplicate, every event is applied once, and each eventId is in the
// inbox once, in the legacy table or in the partitions.
func TestMigrationToTheInboxPartitionsUnderLoadAppliesNoDuplicate(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.useEmptyDatabase()
	ctx := context.Background()
	e.db.Close() // useEmptyDatabase's; the service's pool instead
	var err error
	if e.db, err = db.Open(ctx, e.dbURL, 10); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.db.Close() })
	old, err := zip.OpenReader("../db/testdata/sql-57e6533.zip")
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if _, err := db.Migrate(ctx, e.db, old); err != nil {
		t.Fatal(err)
	}
	// A full inbox: events applied within the TTL, before this test.
	const history = 100_000
	e.db.MustExec(`INSERT INTO processed_event (event_id, event_type, processed_at, fingerprint)
		SELECT gen_random_uuid(), 'TransferCreated', now() - g * interval '20 seconds', '\x00'
		FROM generate_series(1, $1) g`, history)
	var oldInbox int64
	if err := e.db.Get(&oldInbox, `SELECT 'processed_event'::regclass::oid`); err != nil {
		t.Fatal(err)
	}
	svc := e.start(4, nil)

	before := e.publishMany(300, 8)
	waitFor(t, 60*time.Second, "the events before the move applied", func() bool { return svc.rec.count() == len(before) })

	hold, err := e.db.Beginx()
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	hold.MustExec(`LOCK TABLE processed_event IN ACCESS SHARE MODE`)
	owner, err := db.Open(ctx, e.dbURL, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	migrated := make(chan error, 1)
	go func() {
		_, err := db.Migrate(ctx, owner, os.DirFS("../sql"))
		migrated <- err
	}()
	waiting := func(mode string) func() bool {
		return func() bool {
			var n int
			e.db.Get(&n, `SELECT count(*) FROM pg_locks WHERE relation = $1 AND mode = $2 AND NOT granted`, oldInbox, mode)
			return n > 0
		}
	}
	waitFor(t, 30*time.Second, "the migration to wait for the old inbox", waiting("AccessExclusiveLock"))
	during := e.publishMany(200, 8)
	for _, tr := range before[:100] {
		e.publish(tr)
	}
	waitFor(t, 30*time.Second, "a claim to wait behind the migration", waiting("RowExclusiveLock"))
	hold.Rollback()
	if err := <-migrated; err != nil {
		t.Fatalf("migrate under load: %v", err)
	}

	after := e.publishMany(200, 8)
	for _, tr := range before {
		e.publish(tr)
	}
	total := len(before) + len(during) + 100 + len(after) + len(before)
	waitFor(t, 90*time.Second, "every delivery decided", func() bool { return svc.rec.count() == total })

	for _, tr := range before {
		ds := svc.rec.of(tr.EventID)
		for i, d := range ds[1:] {
			if !d.Duplicate {
				t.Errorf("delivery %d of %s, applied before the move: %+v, want a duplicate", i+2, tr.EventID, d)
			}
		}
	}
	var rows struct {
		Legacy int `db:"legacy"`
		Parted int `db:"parted"`
		Twice  int `db:"twice"`
	}
	if err := e.db.Get(&rows, `SELECT
		(SELECT count(*) FROM processed_event_legacy WHERE fingerprint <> '\x00') AS legacy,
		(SELECT count(*) FROM processed_event) AS parted,
		(SELECT count(*) FROM processed_event r JOIN processed_event_legacy l USING (event_id)) AS twice`); err != nil {
		t.Fatal(err)
	}
	if rows.Legacy != len(before) || rows.Parted != len(during)+len(after) || rows.Twice != 0 {
		t.Errorf("inbox: %d rows of this test in the legacy table, %d in the partitions, %d in both; want %d, %d, 0",
			rows.Legacy, rows.Parted, rows.Twice, len(before), len(during)+len(after))
	}
	t.Logf("migrated under load: %d transient failures retried in place", svc.retries.Load())
	e.db.MustExec(`DELETE FROM processed_event_legacy WHERE fingerprint = '\x00'`) // the history inserted above
	e.checkExactlyOnce(append(append(append([]transfer(nil), before...), during...), after...))
}
