package db

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"

	"transferconsumer/consumer"
)

// transferLock namespaces the per-transfer advisory locks.
const transferLock = 7_301_003

// transferRow is a transfer as the transfer table holds it.
type transferRow struct {
	State    string `db:"state"`
	From     string `db:"from_account"`
	To       string `db:"to_account"`
	Amount   int64  `db:"amount_minor"`
	Currency string `db:"currency"`
}

// applyEvent applies a claimed event of any type. It first takes a
// transaction-scoped lock on the transfer, so that a TransferCreated and a
// transition of the same transfer, were they ever consumed at the same time
// (during a repartitioning, or from producers keying them differently), see
// each other's commits: without it both could miss the other and leave a
// transition pending forever. Lock order is always inbox row, transfer,
// balance rows in account order, so it adds no deadlock.
func applyEvent(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`,
		transferLock, ev.Transfer.ID); err != nil {
		return fmt.Errorf("lock transfer %s: %w", ev.Transfer.ID, err)
	}
	switch ev.Type {
	case consumer.EventTransferCreated:
		return created(ctx, tx, ev)
	default:
		return transition(ctx, tx, ev)
	}
}

// created records the transfer, moves the amount, and applies the
// transition that arrived before it, if one is waiting.
func created(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
	t := ev.Transfer
	r, err := tx.ExecContext(ctx, `
		INSERT INTO transfer (transfer_id, from_account, to_account, amount_minor, currency, state, created_event_id)
		VALUES ($1, $2, $3, $4, $5, 'created', $6)
		ON CONFLICT (transfer_id) DO NOTHING`, t.ID, t.FromAccount, t.ToAccount, t.AmountMinor, t.Currency, ev.ID)
	if err != nil {
		return fmt.Errorf("record transfer %s: %w", t.ID, err)
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return consumer.Transition(fmt.Errorf("transfer %s was already created by another event", t.ID))
	}
	if err := moveBalances(ctx, tx, t.FromAccount, t.ToAccount, t.AmountMinor); err != nil {
		return err
	}
	var waiting string
	err = tx.GetContext(ctx, &waiting,
		`DELETE FROM pending_transition WHERE transfer_id = $1 RETURNING event_type`, t.ID)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("take pending transition of %s: %w", t.ID, err)
	}
	// The waiting event was acked long ago; it is applied with the amounts
	// of the transfer, which are authoritative.
	return setState(ctx, tx, t.ID, transferRow{From: t.FromAccount, To: t.ToAccount, Amount: t.AmountMinor}, waiting)
}

// transition applies TransferCompleted or TransferFailed. Before the transfer
// exists it waits in pending_transition; on a transfer already in the target
// state it changes nothing; against the other final state, or with data that
// does not match the transfer, it is a consumer.Transition error.
func transition(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
	t := ev.Transfer
	var cur transferRow
	err := tx.GetContext(ctx, &cur, `
		SELECT state, from_account, to_account, amount_minor, currency
		FROM transfer WHERE transfer_id = $1`, t.ID)
	if errors.Is(err, sql.ErrNoRows) {
		return wait(ctx, tx, ev)
	}
	if err != nil {
		return fmt.Errorf("read transfer %s: %w", t.ID, err)
	}
	if cur.From != t.FromAccount || cur.To != t.ToAccount || cur.Amount != t.AmountMinor || cur.Currency != t.Currency {
		return consumer.Transition(fmt.Errorf("%s for transfer %s carries %s→%s %d %s, the transfer is %s→%s %d %s",
			ev.Type, t.ID, t.FromAccount, t.ToAccount, t.AmountMinor, t.Currency, cur.From, cur.To, cur.Amount, cur.Currency))
	}
	target := stateAfter(ev.Type)
	switch cur.State {
	case target:
		return nil // another event said the same thing; nothing more to do
	case "created":
		return setState(ctx, tx, t.ID, cur, ev.Type)
	}
	return consumer.Transition(fmt.Errorf("%s for transfer %s, which is already %s", ev.Type, t.ID, cur.State))
}

// wait keeps a transition that arrived before its transfer's creation.
func wait(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
	t := ev.Transfer
	r, err := tx.ExecContext(ctx, `
		INSERT INTO pending_transition (transfer_id, event_id, event_type, from_account, to_account, amount_minor, currency)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (transfer_id) DO NOTHING`, t.ID, ev.ID, ev.Type, t.FromAccount, t.ToAccount, t.AmountMinor, t.Currency)
	if err != nil {
		return fmt.Errorf("keep %s of %s pending: %w", ev.Type, t.ID, err)
	}
	if n, _ := r.RowsAffected(); n == 1 {
		return nil
	}
	var other string
	if err := tx.GetContext(ctx, &other,
		`SELECT event_type FROM pending_transition WHERE transfer_id = $1`, t.ID); err != nil {
		return fmt.Errorf("read pending transition of %s: %w", t.ID, err)
	}
	if other == ev.Type {
		return nil // the same transition is already waiting
	}
	return consumer.Transition(fmt.Errorf("%s for transfer %s contradicts the %s waiting for its creation",
		ev.Type, t.ID, other))
}

// setState moves a created transfer to the state eventType leads to; a
// failure gives the amount back. The WHERE clause makes the move happen at
// most once whatever calls it.
func setState(ctx context.Context, tx *sqlx.Tx, id string, t transferRow, eventType string) error {
	state := stateAfter(eventType)
	r, err := tx.ExecContext(ctx, `
		UPDATE transfer SET state = $2, updated_at = now()
		WHERE transfer_id = $1 AND state = 'created'`, id, state)
	if err != nil {
		return fmt.Errorf("mark transfer %s %s: %w", id, state, err)
	}
	if n, _ := r.RowsAffected(); n != 1 || state != "failed" {
		return nil
	}
	return moveBalances(ctx, tx, t.To, t.From, t.Amount)
}

func stateAfter(eventType string) string {
	if eventType == consumer.EventTransferFailed {
		return "failed"
	}
	return "completed"
}

// moveBalances moves amount from one account to another, creating an account
// on first sight. Both rows are written by one statement whose rows are in
// account order, so two transactions touching the same pair of accounts lock
// them in the same order and cannot deadlock each other.
func moveBalances(ctx context.Context, tx *sqlx.Tx, from, to string, amount int64) error {
	first, second := from, to
	firstDelta, secondDelta := -amount, amount
	if second < first {
		first, second = second, first
		firstDelta, secondDelta = secondDelta, firstDelta
	}
	_, err := tx.ExecContext(ctx, `
		INSERT INTO balance_projection AS b (account, balance_minor)
		VALUES ($1, $2), ($3, $4)
		ON CONFLICT (account) DO UPDATE
		SET balance_minor = b.balance_minor + EXCLUDED.balance_minor,
		    updated_at = now()`, first, firstDelta, second, secondDelta)
	if err != nil {
		return fmt.Errorf("move %d from %s to %s: %w", amount, from, to, err)
	}
	return nil
}
