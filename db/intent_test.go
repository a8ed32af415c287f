package db

import (
	"context"
	"os"
	"slices"
	"testing"
)

// No index on the transfers' intent (sql/0013, adr/0012): a new database
// has none, a database with migration 0011's loses it, and the file run
// again changes nothing.
func TestNoTransferIntentIndex(t *testing.T) {
	ctx := context.Background()
	_, owner := freshDB(t)
	if _, err := Migrate(ctx, owner, os.DirFS("../sql")); err != nil {
		t.Fatal(err)
	}
	indexes := func() []string {
		t.Helper()
		var names []string
		if err := owner.Select(&names, `SELECT indexname FROM pg_indexes WHERE tablename = 'transfer' ORDER BY 1`); err != nil {
			t.Fatal(err)
		}
		return names
	}
	// The key, and the BRIN index of the periodic reconciliation (sql/0016).
	want := []string{"transfer_created_range", "transfer_pkey"}
	if got := indexes(); !slices.Equal(got, want) {
		t.Fatalf("a new database's indexes on transfer: %q, want %q", got, want)
	}
	migration, err := os.ReadFile("../sql/0013_no_transfer_intent.sql")
	if err != nil {
		t.Fatal(err)
	}
	owner.MustExec(`CREATE INDEX transfer_intent ON transfer (from_account, created_at, to_account, amount_minor, currency)`)
	owner.MustExec(string(migration))
	if got := indexes(); !slices.Equal(got, want) {
		t.Errorf("0013 over 0011's index: %q, want %q", got, want)
	}
	owner.MustExec(string(migration))
	if got := indexes(); !slices.Equal(got, want) {
		t.Errorf("0013 run again: %q, want %q", got, want)
	}
}
