package db

import (
	"context"
	"database/sql/driver"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"transferconsumer/event"
)

// boom is what the tests' transactions panic with; the caller's recover
// must see it unchanged.
type boom struct{ where string }

// A panic between BEGIN and COMMIT rolls the transaction back on its way
// to the caller: the session is not left idle in transaction with its
// locks, and the connection it ran on can be closed.
func TestInTxRollsBackWhenItsFunctionPanics(t *testing.T) {
	database := testDB(t, 4)
	ctx := context.Background()
	conn, err := database.Connx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p := func() (p any) {
		defer func() { p = recover() }()
		_ = inTx(ctx, conn, func(tx *sqlx.Tx) error {
			if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(7301999)`); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO balance_projection (account, balance_minor) VALUES ('acc_panic', 1)`); err != nil {
				return err
			}
			panic(boom{"inTx"})
		})
		return nil
	}()
	if p != (boom{"inTx"}) {
		t.Fatalf("the caller recovered %v, want the transaction's own panic", p)
	}
	waitFor(t, 5*time.Second, "no session idle in transaction", func() bool { return idleInTransaction(t, database) == 0 })
	var free bool
	if err := database.Get(&free, `SELECT pg_try_advisory_xact_lock(7301999)`); err != nil || !free {
		t.Errorf("the transaction's advisory lock is still held (free %v, %v)", free, err)
	}
	if !returnsWithin(5*time.Second, func() { conn.Close() }) {
		t.Fatal("closing the connection whose transaction panicked did not return within 5s")
	}
	var rows int
	if err := database.Get(&rows, `SELECT count(*) FROM balance_projection WHERE account = 'acc_panic'`); err != nil || rows != 0 {
		t.Errorf("the panicked transaction left %d rows (%v)", rows, err)
	}
}

// A lane whose attempt panicked, once its statement was written and its
// connection kept from an earlier event, holds nothing: no session idle in
// transaction, another lane applies the event at once, and the lane itself
// applies again and closes promptly. (An attempt is one Query message, so
// no Go code of the service runs inside its transaction.)
func TestLaneWhoseAttemptPanickedHoldsNothing(t *testing.T) {
	for _, batch := range []bool{false, true} {
		name := "event"
		if batch {
			name = "batch"
		}
		t.Run(name, func(t *testing.T) {
			database := testDB(t, 6)
			in := NewInbox(database)
			ctx := context.Background()
			l := in.Lane(10 * time.Second).(*lane)
			first := newEvent(t, newID(), event.TransferCreated, newID(), "acc_e", "acc_f", 1)
			if _, err := l.Apply(ctx, first); err != nil || l.conn == nil {
				t.Fatalf("a first event: %v (connection kept: %v)", err, l.conn != nil)
			}
			ev := newEvent(t, newID(), event.TransferCreated, newID(), "acc_a", "acc_b", 700)
			l.beforeSend = func() { panic(boom{"in the attempt"}) }
			p := func() (p any) {
				defer func() { p = recover() }()
				if batch {
					_, _ = l.ApplyBatch(ctx, []event.Event{ev})
				} else {
					_, _ = l.Apply(ctx, ev)
				}
				return nil
			}()
			if p != (boom{"in the attempt"}) {
				t.Fatalf("the caller recovered %v, want the attempt's own panic", p)
			}
			l.beforeSend = nil
			waitFor(t, 5*time.Second, "no session idle in transaction", func() bool { return idleInTransaction(t, database) == 0 })

			// Another lane finds no claim and no lock.
			other := in.Lane(5 * time.Second)
			defer other.Close()
			res, err := other.Apply(ctx, ev)
			if err != nil || res.Duplicate {
				t.Fatalf("another lane applying the event: %+v, %v; want it applied", res, err)
			}
			lanePanicked(t, database, l, ev, true)
		})
	}
}

// lanePanicked checks that l, whose transaction panicked, applies ev again
// (a duplicate or not, as duplicate says) and closes, each within a
// deadline, and that ev's amount moved once.
func lanePanicked(t *testing.T, database *sqlx.DB, l *lane, ev event.Event, duplicate bool) {
	t.Helper()
	var (
		res event.Result
		err error
	)
	if !returnsWithin(5*time.Second, func() { res, err = l.Apply(context.Background(), ev) }) {
		t.Fatal("the lane whose transaction panicked did not apply again within 5s")
	}
	if err != nil || res.Duplicate != duplicate {
		t.Errorf("the lane whose transaction panicked, applying again: %+v, %v; want duplicate %v", res, err, duplicate)
	}
	if !returnsWithin(5*time.Second, l.Close) {
		t.Fatal("closing the lane whose transaction panicked did not return within 5s")
	}
	var balance int64
	if err := database.Get(&balance, `SELECT balance_minor FROM balance_projection WHERE account = $1`,
		ev.Transfer.ToAccount); err != nil || balance != ev.Transfer.AmountMinor {
		t.Errorf("%s has %d (%v), want %d: applied once", ev.Transfer.ToAccount, balance, err, ev.Transfer.AmountMinor)
	}
}

// panicValuer panics when it is turned into a statement's argument.
type panicValuer struct{}

func (panicValuer) Value() (driver.Value, error) { panic(boom{"in an argument"}) }

// A panic while an attempt's arguments are written reaches the caller
// within a deadline, and leaves nothing behind: none is left idle in
// transaction, and the lane applies again and closes promptly.
func TestLaneWhoseArgumentPanickedHoldsNothing(t *testing.T) {
	database := testDB(t, 6)
	in := NewInbox(database)
	ev := newEvent(t, newID(), event.TransferCreated, newID(), "acc_c", "acc_d", 300)
	l := in.Lane(10 * time.Second).(*lane)
	args := []any{ev.ID, ev.Type, panicValuer{}}
	var p any
	if !returnsWithin(10*time.Second, func() {
		defer func() { p = recover() }()
		var outcome string
		_ = l.run(context.Background(), func(b *strings.Builder) error { return inlineCall(b, "apply_event", args) }, &outcome)
	}) {
		t.Fatal("the panic did not reach the caller within 10s")
	}
	if p != (boom{"in an argument"}) {
		t.Fatalf("the caller recovered %v, want the argument's panic", p)
	}
	waitFor(t, 5*time.Second, "no session idle in transaction", func() bool { return idleInTransaction(t, database) == 0 })
	lanePanicked(t, database, l, ev, false)
}

// A publish that panics while the outbox drain holds its rows FOR UPDATE
// leaves them to the next drain, not to a session idle in transaction.
func TestDrainOutboxReleasesItsRowsWhenPublishPanics(t *testing.T) {
	database := testDB(t, 4)
	in := NewInbox(database)
	ctx := context.Background()
	database.MustExec(`INSERT INTO dead_letter_outbox (event_id, event_type, class, reason, routing_key, body)
		VALUES ($1, 'TransferCompleted', 'invalid-transition', 'test', 'acc_a', '\x7b7d')`, newID())
	p := func() (p any) {
		defer func() { p = recover() }()
		_, _ = in.DrainOutbox(ctx, func(event.OutboxLetter) error { panic(boom{"publish"}) })
		return nil
	}()
	if p != (boom{"publish"}) {
		t.Fatalf("the caller recovered %v, want the publish's own panic", p)
	}
	waitFor(t, 5*time.Second, "no session idle in transaction", func() bool { return idleInTransaction(t, database) == 0 })
	n, err := in.DrainOutbox(ctx, func(event.OutboxLetter) error { return nil })
	if err != nil || n != 1 {
		t.Errorf("the next drain published %d letters (%v), want the 1 the panicked drain held", n, err)
	}
}
