package db

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"transferconsumer/event"
)

// v7ID is a version-7 event id minted at t.
func v7ID(t time.Time) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(t.UnixMilli()))
	copy(b[0:6], ms[2:8])
	b[6] = b[6]&0x0f | 0x70
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// partitionOf names the inbox partition holding id, "" when none does.
func partitionOf(t *testing.T, database *sqlx.DB, id string) string {
	t.Helper()
	var name []string
	if err := database.Select(&name, `SELECT tableoid::regclass::text FROM processed_event WHERE event_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if len(name) == 0 {
		return ""
	}
	return name[0]
}

func dayPartition(t time.Time) string {
	return "processed_event_d" + t.UTC().Format("20060102")
}

func balanceOf(t *testing.T, database *sqlx.DB, account string) int64 {
	t.Helper()
	var b int64
	if err := database.Get(&b, `SELECT coalesce((SELECT balance_minor FROM balance_projection WHERE account = $1), 0)`, account); err != nil {
		t.Fatal(err)
	}
	return b
}

// A version-7 id is claimed in the partition of the day it was minted,
// one of any other version wherever its first bits put it; each is a
// duplicate the second time, one at a time and in a batch, whichever
// partition holds it and whatever partitions newer events go to.
func TestDuplicateInAnOlderPartitionIsCaught(t *testing.T) {
	database := testDB(t, 4)
	ctx := context.Background()
	in := NewInbox(database)
	now := time.Now()
	old := newEvent(t, v7ID(now.Add(-72*time.Hour)), event.TransferCreated, newID(), "acc_old", "acc_x", 10)
	v4 := newEvent(t, newID(), event.TransferCreated, newID(), "acc_v4", "acc_x", 10)
	for _, ev := range []event.Event{old, v4} {
		if r, err := in.Apply(ctx, ev); err != nil || r.Duplicate {
			t.Fatalf("apply %s = %+v, %v", ev.ID, r, err)
		}
	}
	if got, want := partitionOf(t, database, old.ID), dayPartition(now.Add(-72*time.Hour)); got != want {
		t.Errorf("an id minted three days ago is in %q, want %q", got, want)
	}
	if got := partitionOf(t, database, v4.ID); got == "" || strings.HasPrefix(got, "processed_event_d") && got != dayPartition(now) {
		t.Logf("the version-4 id is in %s", got)
	}
	// Newer claims go to today's partition.
	fresh := newEvent(t, v7ID(now), event.TransferCreated, newID(), "acc_new", "acc_x", 10)
	if r, err := in.Apply(ctx, fresh); err != nil || r.Duplicate {
		t.Fatalf("apply today's event = %+v, %v", r, err)
	}
	if got, want := partitionOf(t, database, fresh.ID), dayPartition(now); got != want {
		t.Errorf("an id minted now is in %q, want %q", got, want)
	}
	for _, ev := range []event.Event{old, v4} {
		if r, err := in.Apply(ctx, ev); err != nil || !r.Duplicate {
			t.Errorf("%s again = %+v, %v, want a duplicate", ev.ID, r, err)
		}
	}
	l := in.Lane(0)
	defer l.Close()
	out, err := l.(*lane).ApplyBatch(ctx, []event.Event{fresh, old, v4})
	if err != nil || len(out) != 3 {
		t.Fatalf("batch = %+v, %v", out, err)
	}
	for i, o := range out {
		if o.Err != nil || !o.Result.Duplicate {
			t.Errorf("batch outcome %d = %+v, want a duplicate", i, o)
		}
	}
	for _, acc := range []string{"acc_old", "acc_v4", "acc_new"} {
		if b := balanceOf(t, database, acc); b != -10 {
			t.Errorf("%s's balance %d, want -10: applied once", acc, b)
		}
	}
}

// inboxMaintain runs inbox_maintain in tx.
func inboxMaintain(t *testing.T, tx *sqlx.Tx, ttl string, ahead int) []string {
	t.Helper()
	var done []string
	rows, err := tx.Query(`SELECT unnest(inbox_maintain($1::interval, $2))`, ttl, ahead)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		done = append(done, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return done
}

// Retention drops a day's partition whole once its ids are past the TTL.
// A row claimed within the TTL (an event delivered days after its id was
// minted) moves to the default partition first and stays a duplicate; one
// claimed before goes with the partition. A duplicate that arrives while
// the partition is being removed waits for the removal, then is caught.
func TestDuplicateDuringAPartitionsRemovalIsCaught(t *testing.T) {
	database := testDB(t, 4)
	ctx := context.Background()
	in := NewInbox(database)
	minted := time.Now().Add(-72 * time.Hour)
	late := newEvent(t, v7ID(minted), event.TransferCreated, newID(), "acc_late", "acc_y", 7)
	if r, err := in.Apply(ctx, late); err != nil || r.Duplicate {
		t.Fatalf("apply = %+v, %v", r, err)
	}
	expired := v7ID(minted)
	database.MustExec(`INSERT INTO processed_event (event_id, event_type, processed_at, fingerprint)
		VALUES ($1, 'TransferCreated', now() - interval '3 hours', '\x00')`, expired)
	part := dayPartition(minted)

	tx, err := database.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	done := inboxMaintain(t, tx, "1 hour", 31)
	if !strings.Contains(strings.Join(done, "\n"), "dropped "+part+"; 1 of its rows") {
		t.Errorf("inbox_maintain did %q, want %s dropped with one row moved", done, part)
	}
	type outcome struct {
		r   event.Result
		err error
	}
	again := make(chan outcome, 1)
	go func() {
		r, err := in.Apply(ctx, late)
		again <- outcome{r, err}
	}()
	waitFor(t, 60*time.Second, "the duplicate to wait for the partition's removal", func() bool {
		var waiting int
		database.Get(&waiting, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`)
		return waiting > 0
	})
	select {
	case o := <-again:
		t.Fatalf("the duplicate returned %+v, %v during the removal, want it to wait", o.r, o.err)
	default:
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	o := <-again
	if o.err != nil || !o.r.Duplicate {
		t.Errorf("the duplicate during the removal = %+v, %v, want a duplicate", o.r, o.err)
	}
	if r, err := in.Apply(ctx, late); err != nil || !r.Duplicate {
		t.Errorf("the duplicate after the removal = %+v, %v, want a duplicate", r, err)
	}
	if got := partitionOf(t, database, late.ID); got != "processed_event_default" {
		t.Errorf("the late claim is in %q, want processed_event_default", got)
	}
	if got := partitionOf(t, database, expired); got != "" {
		t.Errorf("the claim older than the TTL is still in %q, want it dropped with its partition", got)
	}
	var exists bool
	database.Get(&exists, `SELECT to_regclass($1) IS NOT NULL`, part)
	if exists {
		t.Errorf("%s still exists", part)
	}
	if b := balanceOf(t, database, "acc_late"); b != -7 {
		t.Errorf("acc_late's balance %d, want -7: applied once", b)
	}
}

// The partitions of the days ahead are carved off their year's partition,
// with the claims already there (ids of other versions, clocks ahead),
// which stay duplicates.
func TestMaintainMakesTheDaysAhead(t *testing.T) {
	database := testDB(t, 4)
	ctx := context.Background()
	in := NewInbox(database)
	day := time.Now().UTC().AddDate(0, 0, 32)
	ahead := newEvent(t, v7ID(day), event.TransferCreated, newID(), "acc_ahead", "acc_z", 3)
	if r, err := in.Apply(ctx, ahead); err != nil || r.Duplicate {
		t.Fatalf("apply = %+v, %v", r, err)
	}
	if got := partitionOf(t, database, ahead.ID); !strings.HasPrefix(got, "processed_event_y") {
		t.Fatalf("an id of 32 days ahead is in %q, want a year partition", got)
	}
	var days int
	database.Get(&days, `SELECT inbox_days_ahead()`)
	if days != InboxDaysAhead {
		t.Errorf("inbox_days_ahead() = %d after migrating, want %d", days, InboxDaysAhead)
	}
	// The days back that a new inbox has and a TTL of 720h does not keep.
	if _, err := Maintain(ctx, database, 720*time.Hour); err != nil {
		t.Fatal(err)
	}
	tx, err := database.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := inboxMaintain(t, tx, "720 hours", 33)
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	want := []string{"made " + dayPartition(day), "made " + dayPartition(day.AddDate(0, 0, 1))}
	if strings.Join(done, "\n") != strings.Join(want, "\n") {
		t.Errorf("inbox_maintain did %q, want %q", done, want)
	}
	if got := partitionOf(t, database, ahead.ID); got != dayPartition(day) {
		t.Errorf("the claim is in %q after the carving, want %s", got, dayPartition(day))
	}
	if r, err := in.Apply(ctx, ahead); err != nil || !r.Duplicate {
		t.Errorf("again = %+v, %v, want a duplicate", r, err)
	}
	database.Get(&days, `SELECT inbox_days_ahead()`)
	if days != 33 {
		t.Errorf("inbox_days_ahead() = %d, want 33", days)
	}
	if done, err := Maintain(ctx, database, 720*time.Hour); err != nil || len(done) != 0 {
		t.Errorf("Maintain with nothing to do = %q, %v", done, err)
	}
}

// Row by row, retention leaves the rows of the day partitions it will drop
// whole, and deletes the others past the TTL: ids of other versions, and
// days older than the TTL by two days that nobody dropped.
func TestPruneLeavesTheDaysToMaintenance(t *testing.T) {
	database := testDB(t, 4)
	ctx := context.Background()
	now := time.Now()
	inDay, v4, overdue := v7ID(now.Add(-24*time.Hour)), newID(), v7ID(now.Add(-30*24*time.Hour))
	for _, id := range []string{inDay, v4, overdue} {
		database.MustExec(`INSERT INTO processed_event (event_id, event_type, processed_at, fingerprint)
			VALUES ($1, 'TransferCreated', now() - interval '800 hours', '\x00')`, id)
	}
	res, err := Prune(ctx, database, 27*24*time.Hour, 10)
	if err != nil || res.Deleted != 2 {
		t.Errorf("Prune = %+v, %v, want 2 rows deleted", res, err)
	}
	if partitionOf(t, database, inDay) == "" {
		t.Errorf("Prune deleted the row of yesterday's partition, which maintenance drops whole")
	}
	for _, id := range []string{v4, overdue} {
		if got := partitionOf(t, database, id); got != "" {
			t.Errorf("the expired claim %s is still in %s", id, got)
		}
	}
}

// An inbox that held claims before its partitions is kept as
// processed_event_legacy: what it holds stays a duplicate, and
// maintenance drops it once its newest claim is past the TTL. The
// service's role may not maintain the partitions: it is refused, as
// Maintain's callers expect.
func TestTheInboxBeforeItsPartitionsIsKeptUntilItsTTL(t *testing.T) {
	ctx := context.Background()
	// The migrations as released at 57e6533, before the partitions.
	owner, _, svc := releasedSchema(t, "testdata/sql-57e6533.zip", false)
	before := newEvent(t, v7ID(time.Now()), event.TransferCreated, newID(), "acc_l", "acc_m", 5)
	if _, err := NewInbox(svc).Apply(ctx, before); err != nil {
		t.Fatal(err)
	}
	if _, err := Migrate(ctx, owner, os.DirFS("../sql")); err != nil {
		t.Fatal(err)
	}
	in := NewInbox(svc)
	if r, err := in.Apply(ctx, before); err != nil || !r.Duplicate {
		t.Errorf("the event claimed before the partitions, again = %+v, %v, want a duplicate", r, err)
	}
	if got := partitionOf(t, owner, before.ID); got != "" {
		t.Errorf("the duplicate was claimed again, in %s", got)
	}
	if _, err := Maintain(ctx, svc, time.Hour); !Refused(err) {
		t.Errorf("Maintain as the service's role = %v, want refused (42501)", err)
	}
	if done, err := Maintain(ctx, owner, time.Hour); err != nil || strings.Contains(strings.Join(done, ""), "legacy") {
		t.Errorf("Maintain with a claim of now in processed_event_legacy = %q, %v, want it kept", done, err)
	}
	owner.MustExec(`UPDATE processed_event_legacy SET processed_at = now() - interval '2 hours'`)
	done, err := Maintain(ctx, owner, time.Hour)
	if err != nil || !strings.Contains(strings.Join(done, "\n"), "dropped processed_event_legacy") {
		t.Errorf("Maintain with processed_event_legacy past the TTL = %q, %v, want it dropped", done, err)
	}
	// Past the TTL, the claim is forgotten, as retention always did; the
	// transfer it created still stops it moving money twice.
	if r, err := in.Apply(ctx, before); err != nil || !r.Duplicate {
		t.Errorf("the event again, past the TTL = %+v, %v, want the transfer's duplicate", r, err)
	}
	if got, want := partitionOf(t, owner, before.ID), dayPartition(time.Now()); got != want {
		t.Errorf("the event past the TTL was claimed in %q, want %q", got, want)
	}
	if b := balanceOf(t, owner, "acc_l"); b != -5 {
		t.Errorf("acc_l's balance %d, want -5", b)
	}
}

// A reader that holds the inbox open (a long report) does not hold every
// claim behind the maintenance's lock request for long: the maintenance
// gives up after its lock_timeout, and claims go on; the next run does
// the work.
func TestMaintainGivesUpOnALongReader(t *testing.T) {
	database := testDB(t, 4)
	ctx := context.Background()
	reader, err := database.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback()
	reader.MustExec(`SELECT count(*) FROM processed_event`)
	// A TTL of an hour leaves days to drop: the maintenance needs the lock.
	bounded, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	_, err = Maintain(bounded, database, time.Hour)
	var pqErr *pq.Error
	if !errors.As(err, &pqErr) || pqErr.Code != "55P03" {
		t.Fatalf("Maintain behind a reader = %v, want lock_timeout (55P03)", err)
	}
	ev := newEvent(t, v7ID(time.Now()), event.TransferCreated, newID(), "acc_r", "acc_s", 1)
	if r, err := NewInbox(database).Apply(ctx, ev); err != nil || r.Duplicate {
		t.Errorf("a claim after the maintenance gave up = %+v, %v", r, err)
	}
	reader.Rollback()
	if done, err := Maintain(ctx, database, time.Hour); err != nil || len(done) == 0 {
		t.Errorf("Maintain once the reader is gone = %q, %v, want the days past the TTL dropped", done, err)
	}
}
