package db

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
)

// dayAt is an SQL expression for a time in the day param (a number of
// days) before today (the ring's slots are days, sql/0011), an hour after
// it began.
func dayAt(param string) string {
	return `to_timestamp((floor(extract(epoch FROM now()) / 86400) - ` + param + `::int) * 86400) + interval '1 hour'`
}

// fillDay inserts n inbox rows claimed `days` days ago, in that day's slot,
// and returns the slot.
func fillDay(t *testing.T, database *sqlx.DB, days, n int) int {
	t.Helper()
	database.MustExec(`INSERT INTO processed_event (event_id, event_type, processed_at, fingerprint, slot)
		SELECT gen_random_uuid(), 'TransferCreated', `+dayAt("$1")+`, '\x00', inbox_slot(`+dayAt("$1")+`)
		FROM generate_series(1, $2)`, days, n)
	var slot int
	if err := database.Get(&slot, `SELECT inbox_slot(`+dayAt("$1")+`)`, days); err != nil {
		t.Fatal(err)
	}
	return slot
}

// slotRows counts the rows of slot's partition.
func slotRows(t *testing.T, database *sqlx.DB, slot int) int {
	t.Helper()
	var n int
	if err := database.Get(&n, `SELECT count(*) FROM processed_event WHERE slot = $1`, slot); err != nil {
		t.Fatal(err)
	}
	return n
}

// Retention empties the slot whose rows are all older than INBOX_TTL and
// no other: not the one whose last day ends within the TTL, nor today's,
// nor yesterday's. Its lock lives only as long as a step's transaction: a
// run leaves no advisory lock behind on any session, and a run that finds
// the lock held (another replica's step in progress) does nothing.
func TestPruneTakesTurnsAndLeavesNoLock(t *testing.T) {
	database := testDB(t, 4)
	ctx := context.Background()
	old := fillDay(t, database, 31, 25) // ended 30 days ago
	young := fillDay(t, database, 30, 5)
	yesterday := fillDay(t, database, 1, 5)
	today := fillDay(t, database, 0, 5)

	other, err := database.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	other.MustExec(`SELECT pg_advisory_xact_lock($1)`, pruneLock)
	res, err := Prune(ctx, database, 720*time.Hour, 10)
	if err != nil || res.Ran || len(res.Truncated) != 0 {
		t.Errorf("with the lock held elsewhere, Prune = %+v, %v; want nothing done", res, err)
	}
	other.Rollback()

	res, err = Prune(ctx, database, 720*time.Hour, 10)
	if err != nil || !res.Ran || !slices.Equal(res.Truncated, []int{old}) || res.Ring != (Ring{Slots: 32, Width: 24 * time.Hour}) {
		t.Errorf("Prune = %+v, %v; want slot %d emptied, of a ring of 32 days", res, err, old)
	}
	for slot, want := range map[int]int{old: 0, young: 5, yesterday: 5, today: 5} {
		if n := slotRows(t, database, slot); n != want {
			t.Errorf("slot %d holds %d rows after the prune, want %d", slot, n, want)
		}
	}
	var held int
	if err := database.Get(&held, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = $1`, pruneLock); err != nil || held != 0 {
		t.Errorf("%d prune locks held after the run (%v), want 0", held, err)
	}
	if res, err := Prune(ctx, database, 720*time.Hour, 10); err != nil || len(res.Truncated) != 0 {
		t.Errorf("Prune again = %+v, %v; want nothing left to empty", res, err)
	}
}

// A TRUNCATE that got its partition after the slot's turn came again (the
// clock passed the turn while it waited) empties nothing: a claim of the
// new round may already be waiting to write there.
func TestPruneLeavesASlotWhoseTurnCame(t *testing.T) {
	database := testDB(t, 2)
	ctx := context.Background()
	old := fillDay(t, database, 31, 3)
	ran, emptied, err := truncateSlot(ctx, database, dueSlot{Slot: old, Until: time.Now().Add(-time.Minute)}, time.Second)
	if err != nil || !ran || emptied {
		t.Errorf("truncateSlot past the turn = %v, %v, %v; want it run, nothing emptied", ran, emptied, err)
	}
	if n := slotRows(t, database, old); n != 3 {
		t.Errorf("slot %d holds %d rows, want its 3", old, n)
	}
}

// A TRUNCATE waits for its partition at most the lock timeout, and so
// holds claims up no longer: a slot kept busy is reported waiting, not
// emptied, and the next run empties it.
func TestPruneGivesUpOnABusySlot(t *testing.T) {
	database := testDB(t, 4)
	ctx := context.Background()
	old := fillDay(t, database, 31, 3)
	busy, err := database.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Rollback()
	busy.MustExec(`LOCK TABLE ` + slotPartition(old) + ` IN ACCESS SHARE MODE`)
	r := Retention{TTL: 720 * time.Hour, Batch: 10, LockTimeout: 20 * time.Millisecond, Attempts: 2}
	res, err := r.Run(ctx, database)
	if err != nil || len(res.Truncated) != 0 || !slices.Equal(res.Waiting, []int{old}) {
		t.Errorf("Run with the slot busy = %+v, %v; want slot %d waiting", res, err, old)
	}
	busy.Rollback()
	if res, err := r.Run(ctx, database); err != nil || !slices.Equal(res.Truncated, []int{old}) {
		t.Errorf("Run once free = %+v, %v; want slot %d emptied", res, err, old)
	}
}

// An INBOX_TTL longer than the ring covers empties nothing that the TTL
// still protects: the slot a 30-day TTL empties stays full under 31 days,
// and the ring says why.
func TestPruneWithTTLBeyondTheRing(t *testing.T) {
	database := testDB(t, 2)
	ctx := context.Background()
	old := fillDay(t, database, 31, 3)
	res, err := Prune(ctx, database, 31*24*time.Hour, 10)
	if err != nil || len(res.Truncated) != 0 {
		t.Errorf("Prune with a 31-day TTL = %+v, %v; want nothing emptied", res, err)
	}
	if n := slotRows(t, database, old); n != 3 {
		t.Errorf("slot %d holds %d rows, want its 3", old, n)
	}
	if w := RingWarning(res.Ring, 31*24*time.Hour); w == "" {
		t.Error("no warning for a 31-day TTL on a ring that covers 30 days")
	}
	if w := RingWarning(res.Ring, 30*24*time.Hour); w != "" {
		t.Errorf("a warning for a 30-day TTL on a ring that covers 30 days: %s", w)
	}
}

// The oldest row's age is read from each slot's first pages, where its
// oldest rows are.
func TestOldestInboxAge(t *testing.T) {
	database := testDB(t, 2)
	ctx := context.Background()
	if age, err := OldestInboxAge(ctx, database); err != nil || age != 0 {
		t.Errorf("OldestInboxAge of an empty inbox = %s, %v; want 0", age, err)
	}
	fillDay(t, database, 0, 2)
	fillDay(t, database, 3, 2)
	age, err := OldestInboxAge(ctx, database)
	if err != nil || age < 3*24*time.Hour || age > 4*24*time.Hour {
		t.Errorf("OldestInboxAge = %s, %v; want between 3 and 4 days", age, err)
	}
}

// migrate grows the ring for a longer INBOX_TTL, never shrinks it, and
// retention then empties nothing until every row the smaller ring placed
// is older than the TTL: the new formula maps days to other slots. Once
// they are (the change moved back in time here), the slot the new ring
// says is due is emptied, and a claim finds the rows of either formula.
func TestSizeRingGrowsForALongerTTL(t *testing.T) {
	database := testDB(t, 2)
	ctx := context.Background()
	if ring, grown, err := SizeRing(ctx, database, 720*time.Hour); err != nil || grown || ring.Slots != 32 {
		t.Errorf("SizeRing(720h) = %+v, %v, %v; want the 32 slots kept", ring, grown, err)
	}
	before := fillDay(t, database, 31, 3) // due under 32 slots and a 30-day TTL
	for day := 1; day < 30; day++ {
		fillDay(t, database, day, 1) // young: the new formula maps some of their slots to old days
	}
	ring, grown, err := SizeRing(ctx, database, 40*24*time.Hour)
	if err != nil || !grown || ring.Slots != 42 || ring.Covers() != 40*24*time.Hour {
		t.Fatalf("SizeRing(40 days) = %+v, %v, %v; want 42 slots covering 40 days", ring, grown, err)
	}
	var parts int
	database.Get(&parts, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'processed_event'::regclass`)
	if parts != 42 {
		t.Errorf("%d partitions, want 42", parts)
	}
	if ring, grown, err := SizeRing(ctx, database, 720*time.Hour); err != nil || grown || ring.Slots != 42 {
		t.Errorf("SizeRing(720h) after = %+v, %v, %v; want the 42 slots kept", ring, grown, err)
	}
	if res, err := Prune(ctx, database, 720*time.Hour, 10); err != nil || len(res.Truncated) != 0 {
		t.Errorf("Prune just after the ring grew = %+v, %v; want nothing emptied", res, err)
	}
	var rows int
	database.Get(&rows, `SELECT count(*) FROM processed_event`)
	if rows != 3+29 {
		t.Errorf("%d inbox rows after the ring grew and retention ran, want all %d", rows, 3+29)
	}

	database.MustExec(`UPDATE inbox_ring SET resized_at = now() - interval '41 days'`)
	due := fillDay(t, database, 41, 2) // due under 42 slots and a 40-day TTL
	res, err := Prune(ctx, database, 40*24*time.Hour, 10)
	if err != nil || !slices.Equal(res.Truncated, []int{due}) {
		t.Errorf("Prune a TTL after the ring grew = %+v, %v; want slot %d emptied", res, err, due)
	}
	ev := newEvent(t, newID(), "TransferCreated", newID(), "acc_a", "acc_b", 1)
	database.MustExec(`INSERT INTO processed_event (event_id, event_type, processed_at, fingerprint, slot)
		VALUES ($1, $2, now() - interval '20 days', $3, $4)`, ev.ID, ev.Type, ev.Fingerprint, before)
	if r, err := NewInbox(database).Apply(ctx, ev); err != nil || !r.Duplicate {
		t.Errorf("an event in a slot of the smaller ring, again = %+v, %v; want a duplicate", r, err)
	}
}
