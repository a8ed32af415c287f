package db

import (
	"context"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jmoiron/sqlx"

	"transferconsumer/event"
)

// conflicts counts the producer_conflict rows of event id.
func conflicts(t *testing.T, database *sqlx.DB, id string) int {
	t.Helper()
	var n int
	if err := database.Get(&n, `SELECT count(*) FROM producer_conflict WHERE event_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	return n
}

// A redelivery of the same conflicting message records nothing new, alone
// or in a batch; each delivery is still a conflict, and other content is
// a conflict recorded of its own.
func TestProducerConflictIsRecordedOnce(t *testing.T) {
	database := testDB(t, 4)
	in := NewInbox(database)
	ctx := context.Background()
	id, transfer := newID(), newID()
	if _, err := in.Apply(ctx, newEvent(t, id, event.TransferCreated, transfer, "acc_a", "acc_b", 100)); err != nil {
		t.Fatal(err)
	}
	other := newEvent(t, id, event.TransferCreated, transfer, "acc_a", "acc_b", 999)
	isConflict := func(what string, err error) {
		t.Helper()
		if event.ClassOf(ctx, err) != event.ClassConflict {
			t.Errorf("%s: %v, want a producer conflict", what, err)
		}
	}
	for i := 0; i < 3; i++ {
		_, err := in.Apply(ctx, other)
		isConflict("delivery "+strconv.Itoa(i+1), err)
	}
	l := in.Lane(0).(*lane)
	defer l.Close()
	outs, err := l.ApplyBatch(ctx, []event.Event{other, other})
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range outs {
		isConflict("in a batch, "+strconv.Itoa(i+1), o.Err)
	}
	if n := conflicts(t, database, id); n != 1 {
		t.Errorf("%d producer_conflict rows after five deliveries of one conflicting message, want 1", n)
	}

	third := newEvent(t, id, event.TransferCreated, transfer, "acc_a", "acc_c", 100)
	_, err = in.Apply(ctx, third)
	isConflict("other content", err)
	_, err = in.Apply(ctx, third)
	isConflict("other content again", err)
	if n := conflicts(t, database, id); n != 2 {
		t.Errorf("%d producer_conflict rows after a second conflicting content, want 2", n)
	}
}

// The migration that records conflicts once keeps the first row of each
// conflict that redeliveries recorded before it, and runs again harmlessly.
func TestProducerConflictMigrationKeepsTheFirstOfEach(t *testing.T) {
	all := os.DirFS("../sql")
	files, err := fs.Glob(all, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	var once string
	before := fstest.MapFS{}
	for _, f := range files {
		if strings.HasSuffix(f, "_producer_conflict_once.sql") {
			once = f
			break
		}
		b, err := fs.ReadFile(all, f)
		if err != nil {
			t.Fatal(err)
		}
		before[f] = &fstest.MapFile{Data: b}
	}
	if once == "" {
		t.Fatal("no migration *_producer_conflict_once.sql in ../sql")
	}

	database := testDBWith(t, 4, before)
	a, b := newID(), newID()
	database.MustExec(`INSERT INTO producer_conflict (event_id, stored_fingerprint, received_fingerprint, received_at) VALUES
		($1, '\x01', '\x02', '2026-01-01'), ($1, '\x01', '\x02', '2026-01-02'), ($1, '\x01', '\x03', '2026-01-03'),
		($2, '\x01', '\x02', '2026-01-04'), ($1, '\x01', '\x02', '2026-01-05')`, a, b)
	if _, err := Migrate(context.Background(), database, all); err != nil {
		t.Fatal(err)
	}
	var kept []string
	if err := database.Select(&kept, `SELECT event_id || ' ' || encode(received_fingerprint, 'hex') || ' ' || to_char(received_at, 'MM-DD')
		FROM producer_conflict ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	want := []string{a + " 02 01-01", a + " 03 01-03", b + " 02 01-04"}
	if strings.Join(kept, ", ") != strings.Join(want, ", ") {
		t.Errorf("kept %q, want %q", kept, want)
	}
	body, err := fs.ReadFile(all, once)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := database.Exec(string(body)); err != nil {
		t.Errorf("%s run again: %v", once, err)
	}
}
