package db

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"

	"github.com/jmoiron/sqlx"

	"transferconsumer/consumer"
)

// Inbox applies events to the balance projection, each exactly once in
// effect. It implements consumer.Applier.
type Inbox struct {
	db *sqlx.DB
}

// NewInbox returns an Inbox over db.
func NewInbox(db *sqlx.DB) *Inbox { return &Inbox{db: db} }

// Apply claims ev.ID in the inbox and applies its effect in the same local
// transaction, then commits. The claim comes first and is an INSERT, not a
// lookup: two deliveries of one event racing each other both try to insert,
// the primary key lets exactly one win, and the loser waits for the winner's
// commit and finds the row. A check-then-insert would let both decide to
// apply. Because claim and effect share the transaction, a failed effect
// rolls the claim back too, and the redelivery applies it.
//
// It returns Result{Duplicate: true} when ev.ID was applied before with the
// same content; a consumer.Conflict error when it was applied with other
// content (after recording the conflict in producer_conflict); a
// consumer.Transition error when a lifecycle event contradicts its transfer
// (nothing is written then, the claim included); a
// consumer.Transient error when the database is unreachable or asks for a
// retry (serialization failure, deadlock); any other error as is.
func (in *Inbox) Apply(ctx context.Context, ev consumer.Event) (consumer.Result, error) {
	var res consumer.Result
	var conflict error
	err := inTx(ctx, in.db, func(tx *sqlx.Tx) error {
		claimed, stored, err := claim(ctx, tx, ev)
		switch {
		case err != nil:
			return err
		case claimed:
			return applyEvent(ctx, tx, ev)
		case bytes.Equal(stored, ev.Fingerprint):
			res.Duplicate = true
			return nil
		}
		conflict = fmt.Errorf("producer conflict: event %s was applied with content fingerprint %s, this delivery has %s",
			ev.ID, hex.EncodeToString(stored), hex.EncodeToString(ev.Fingerprint))
		_, err = tx.ExecContext(ctx, `
			INSERT INTO producer_conflict (event_id, stored_fingerprint, received_fingerprint)
			VALUES ($1, $2, $3)`, ev.ID, stored, ev.Fingerprint)
		return err
	})
	if err != nil {
		return consumer.Result{}, fmt.Errorf("apply event %s: %w", ev.ID, translate(err))
	}
	if conflict != nil {
		return consumer.Result{}, consumer.Conflict(conflict)
	}
	return res, nil
}

// claim inserts the inbox row and reports whether this transaction owns the
// event; when it does not, it returns the fingerprint stored by the one that
// does. ON CONFLICT DO NOTHING keeps the transaction usable on a duplicate (a
// unique violation would abort it).
func claim(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) (bool, []byte, error) {
	r, err := tx.ExecContext(ctx, `
		INSERT INTO processed_event (event_id, event_type, fingerprint)
		VALUES ($1, $2, $3)
		ON CONFLICT (event_id) DO NOTHING`, ev.ID, ev.Type, ev.Fingerprint)
	if err != nil {
		return false, nil, fmt.Errorf("claim: %w", err)
	}
	n, err := r.RowsAffected()
	if err != nil {
		return false, nil, fmt.Errorf("claim: %w", err)
	}
	if n == 1 {
		return true, nil, nil
	}
	// Already processed. Reading the row now is safe: it is committed
	// (ON CONFLICT waited for its transaction) and is never updated.
	var stored []byte
	if err := tx.GetContext(ctx, &stored,
		`SELECT fingerprint FROM processed_event WHERE event_id = $1`, ev.ID); err != nil {
		return false, nil, fmt.Errorf("read claimed event: %w", err)
	}
	return false, stored, nil
}
