package db

import (
	"context"
	"os"
	"testing"
)

// transfer_intent is ordered by paying account, then creation time
// (sql/0011, adr/0010): a new database gets it so, a database with the
// index of migration 0010 gets it rebuilt, and the file run again leaves
// the index alone.
func TestTransferIntentInArrivalOrder(t *testing.T) {
	ctx := context.Background()
	_, owner := freshDB(t)
	if _, err := Migrate(ctx, owner, os.DirFS("../sql")); err != nil {
		t.Fatal(err)
	}
	const want = "CREATE INDEX transfer_intent ON public.transfer USING btree (from_account, created_at, to_account, amount_minor, currency)"
	index := func() (def string, file uint32) {
		t.Helper()
		if err := owner.QueryRowx(`SELECT pg_get_indexdef('transfer_intent'::regclass), pg_relation_filenode('transfer_intent')`).Scan(&def, &file); err != nil {
			t.Fatal(err)
		}
		return def, file
	}
	def, file := index()
	if def != want {
		t.Fatalf("a new database's transfer_intent:\n%s\nwant\n%s", def, want)
	}
	migration, err := os.ReadFile("../sql/0011_transfer_intent_by_payer.sql")
	if err != nil {
		t.Fatal(err)
	}
	owner.MustExec(string(migration))
	if again, fileAgain := index(); again != want || fileAgain != file {
		t.Errorf("0011 run again: %s (file %d), want the index untouched (file %d)", again, fileAgain, file)
	}

	owner.MustExec(`DROP INDEX transfer_intent`)
	owner.MustExec(`CREATE INDEX transfer_intent ON transfer (from_account, to_account, amount_minor, currency, created_at)`)
	owner.MustExec(string(migration))
	if def, _ := index(); def != want {
		t.Errorf("0011 over 0010's index: %s, want %s", def, want)
	}
}
