package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"
)

// event is a TransferCreated of the contract's shape.
type event struct {
	EventID    string `json:"eventId"`
	EventType  string `json:"eventType"`
	OccurredAt string `json:"occurredAt"`
	Data       struct {
		TransferID  string `json:"transferId"`
		FromAccount string `json:"fromAccount"`
		ToAccount   string `json:"toAccount"`
		AmountMinor int64  `json:"amountMinor"`
		Currency    string `json:"currency"`
	} `json:"data"`
}

// timeOrderedIDs makes the event and transfer ids of backlogs (and of the
// scale benchmark's prefill) time-ordered, laid out as UUID version 7 (RFC
// 9562): 48 bits of Unix milliseconds first, then random bits. Producers
// choose their ids; this measures what that choice does to the indexes
// keyed by them (BENCHMARKS.md, "The inbox at scale").
var timeOrderedIDs bool

// completeAfter, when not 0, makes half of a backlog's events the
// completions of the other half's creations, each this many creations after
// its own (the scale benchmark's -complete-after): what a transition costs
// the transfer table and its indexes.
var completeAfter int

// backlog returns n TransferCreated events over accounts accounts, the same
// for every subject of a run (a fixed seed). Their ids are random (version
// 4), or time-ordered from now on, a millisecond apart, with
// timeOrderedIDs.
func backlog(n, accounts int, seed uint64) []event {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	start := time.Now().UnixMilli()
	uuid := func(nth int) string {
		b := make([]byte, 16)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		b[6] = b[6]&0x0f | 0x40
		if timeOrderedIDs {
			ms := uint64(start + int64(nth))
			for k := range 6 {
				b[k] = byte(ms >> (40 - 8*k))
			}
			b[6] = b[6]&0x0f | 0x70
		}
		b[8] = b[8]&0x3f | 0x80
		return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
	}
	creations := n
	if completeAfter > 0 {
		creations = (n + 1) / 2
	}
	out := make([]event, creations)
	for i := range out {
		e := &out[i]
		e.EventID, e.EventType = uuid(i), "TransferCreated"
		e.OccurredAt = time.Date(2026, 7, 10, 12, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Millisecond).Format(time.RFC3339Nano)
		e.Data.TransferID = uuid(i)
		from := r.IntN(accounts)
		to := r.IntN(accounts - 1)
		if to >= from {
			to++
		}
		e.Data.FromAccount, e.Data.ToAccount = fmt.Sprintf("acc_%05d", from), fmt.Sprintf("acc_%05d", to)
		e.Data.AmountMinor = int64(1 + r.IntN(100_000))
		e.Data.Currency = "EUR"
	}
	if completeAfter == 0 {
		return out
	}
	// Each creation's completion, completeAfter creations later (the same
	// account: the same queue, after it), n events in all.
	all := make([]event, 0, n)
	complete := func(i int) {
		c := out[i]
		c.EventID, c.EventType = uuid(creations+i), "TransferCompleted"
		all = append(all, c)
	}
	for i := range out {
		all = append(all, out[i])
		if j := i - completeAfter; j >= 0 && len(all) < n {
			complete(j)
		}
	}
	for j := max(len(out)-completeAfter, 0); len(all) < n; j++ {
		complete(j)
	}
	return all
}

// txApplier runs the service's transaction for an event: BEGIN, the
// prepared call of apply_event (sql/functions/apply_event.sql: the inbox claim
// first, the transfer lock, the transfer row, both balances in account order,
// a waiting transition), COMMIT. The peer and the bare loop run exactly this,
// so that the comparison measures the consumers, not different SQL; like the
// service they decode the body and fingerprint it first.
type txApplier struct {
	db   *sql.DB
	stmt *sql.Stmt
}

func newTxApplier(db *sql.DB) *txApplier {
	stmt, err := db.Prepare(`SELECT apply_event($1, $2, $3, $4, $5, $6, $7, $8, NULL, NULL, NULL, NULL, NULL)`)
	if err != nil {
		fail(err)
	}
	return &txApplier{db: db, stmt: stmt}
}

func (a *txApplier) apply(ctx context.Context, body []byte) error {
	var e event
	if err := json.Unmarshal(body, &e); err != nil {
		return err
	}
	sum := sha256.Sum256(body)
	tx, err := a.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	d := e.Data
	var outcome string
	if err := tx.StmtContext(ctx, a.stmt).QueryRowContext(ctx, e.EventID, e.EventType, sum[:],
		d.TransferID, d.FromAccount, d.ToAccount, d.AmountMinor, d.Currency).Scan(&outcome); err != nil {
		return err
	}
	return tx.Commit()
}
