package reconcile

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"os"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"transferconsumer/db"
	"transferconsumer/dbtest"
	"transferconsumer/event"
)

// testDB returns a database of the test's own (dbtest.Create), migrated
// with ../sql, with a pool of maxConns.
func testDB(t testing.TB, maxConns int) *sqlx.DB {
	t.Helper()
	return testDBWith(t, maxConns, os.DirFS("../sql"))
}

// testDBWith is testDB migrated with migrations.
func testDBWith(t testing.TB, maxConns int, migrations fs.FS) *sqlx.DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	database, err := db.Open(ctx, dbtest.Create(t), maxConns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { database.Close() })
	// Its own bound: twenty-odd migrations take seconds on a loaded
	// machine, where ten seconds for them all timed tests out.
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := db.Migrate(ctx, database, migrations); err != nil {
		t.Fatal(err)
	}
	return database
}

// waitFor polls cond until it holds or timeout passes, and fails the test
// then; no test sleeps.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Errorf("timed out after %s waiting for %s", timeout, what)
			return false
		}
		<-tick.C
	}
	return true
}

// applyIn applies ev in tx, a transaction the test holds open, and sets
// outcome to apply_event's.
func applyIn(ctx context.Context, tx *sqlx.Tx, outcome *string, ev event.Event) error {
	t, m := ev.Transfer, ev.Message
	return tx.GetContext(ctx, outcome, `SELECT apply_event($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL, $11, $12)`,
		ev.ID, ev.Type, ev.Fingerprint, t.ID, t.FromAccount, t.ToAccount, t.AmountMinor, t.Currency,
		m.RoutingKey, m.Body, m.MessageID, m.ContentType)
}

// newID is a random UUID (version 4).
func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// newEvent decodes an event of the contract's shape, as the worker would.
func newEvent(t testing.TB, id, typ, transfer, from, to string, amount int64) event.Event {
	t.Helper()
	body, _ := json.Marshal(map[string]any{
		"eventId": id, "eventType": typ, "occurredAt": "2026-07-10T12:00:00Z",
		"data": map[string]any{"transferId": transfer, "fromAccount": from, "toAccount": to,
			"amountMinor": amount, "currency": "EUR"},
	})
	ev, err := event.Decode(body, "", "")
	if err != nil {
		t.Fatal(err)
	}
	ev.Message = event.Message{RoutingKey: from, Body: body, MessageID: id, ContentType: "application/json"}
	return ev
}
