package db

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/jmoiron/sqlx"

	"transferconsumer/consumer"
)

// Inbox applies events to the balance projection and the transfers'
// states, each exactly once in effect. It implements consumer.Applier.
type Inbox struct {
	db *sqlx.DB

	mu    sync.Mutex
	apply *sqlx.Stmt // prepared once, re-prepared by database/sql per connection
}

// NewInbox returns an Inbox over db.
func NewInbox(db *sqlx.DB) *Inbox { return &Inbox{db: db} }

// Apply claims ev.ID in the inbox and applies its effect in the same local
// transaction, then commits. The work is one call of the apply_event
// function (sql/0004_apply_event.sql), so an event costs three round trips:
// BEGIN, the call, COMMIT.
//
// The claim comes first and is an INSERT, not a lookup: two deliveries of one
// event racing each other both try to insert, the primary key lets exactly
// one win, and the loser waits for the winner's commit and finds the row. A
// check-then-insert would let both decide to apply. Because claim and effect
// share the transaction, a failed effect rolls the claim back too, and the
// redelivery applies it.
//
// It returns Result{Duplicate: true} when ev.ID was applied before with the
// same content; a consumer.Conflict error when it was applied with other
// content (after recording the conflict in producer_conflict); a
// consumer.Transition error when a lifecycle event contradicts its transfer
// (nothing is written then, the claim included); a consumer.Transient error
// when the database is unreachable or asks for a retry (serialization
// failure, deadlock); any other error as is.
func (in *Inbox) Apply(ctx context.Context, ev consumer.Event) (consumer.Result, error) {
	stmt, err := in.statement(ctx)
	if err != nil {
		return consumer.Result{}, fmt.Errorf("apply event %s: %w", ev.ID, translate(err))
	}
	t := ev.Transfer
	var outcome string
	err = inTx(ctx, in.db, func(tx *sqlx.Tx) error {
		return tx.StmtxContext(ctx, stmt).QueryRowxContext(ctx,
			ev.ID, ev.Type, ev.Fingerprint, t.ID, t.FromAccount, t.ToAccount, t.AmountMinor, t.Currency).Scan(&outcome)
	})
	if err != nil {
		return consumer.Result{}, fmt.Errorf("apply event %s: %w", ev.ID, translate(err))
	}
	switch {
	case outcome == "applied":
		return consumer.Result{}, nil
	case outcome == "duplicate":
		return consumer.Result{Duplicate: true}, nil
	case strings.HasPrefix(outcome, "conflict:"):
		return consumer.Result{}, consumer.Conflict(fmt.Errorf(
			"producer conflict: event %s was applied with content fingerprint %s, this delivery has %x",
			ev.ID, strings.TrimPrefix(outcome, "conflict:"), ev.Fingerprint))
	}
	return consumer.Result{}, fmt.Errorf("apply event %s: unexpected outcome %q", ev.ID, outcome)
}

// statement prepares the apply_event call the first time it is needed. A
// failure is not kept: the next event tries again.
func (in *Inbox) statement(ctx context.Context) (*sqlx.Stmt, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.apply != nil {
		return in.apply, nil
	}
	stmt, err := in.db.PreparexContext(ctx, `SELECT apply_event($1, $2, $3, $4, $5, $6, $7, $8)`)
	if err != nil {
		return nil, errors.Join(errors.New("prepare apply_event"), err)
	}
	in.apply = stmt
	return stmt, nil
}
