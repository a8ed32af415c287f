package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"fmt"
	mrand "math/rand/v2"
	"sync"
)

// sqlEvent is an event as the service hands it to apply_event
// (sql/functions/apply_event.sql): the benchmarks that measure the
// database alone call the function as the service's lane does, one event
// per transaction, without the broker.
type sqlEvent struct {
	ID, Type, Transfer, From, To string
	Amount                       int64
}

// applyEventSQL is the service's call, with parameters instead of the
// lane's inline literals (the server's work is the same).
const applyEventSQL = `SELECT apply_event($1::uuid, $2, $3::bytea, $4::uuid, $5, $6, $7::bigint, 'EUR', $5, NULL, NULL, $1::text, 'application/json')`

// apply applies e in a transaction of its own on conn.
func (e sqlEvent) apply(ctx context.Context, conn *sql.Conn) error {
	fp := sha256.Sum256([]byte(e.ID + e.Type))
	var outcome string
	if err := conn.QueryRowContext(ctx, applyEventSQL, e.ID, e.Type, fp[:], e.Transfer, e.From, e.To, e.Amount).Scan(&outcome); err != nil {
		return fmt.Errorf("apply %s %s: %w", e.Type, e.ID, err)
	}
	if outcome != "applied" {
		return fmt.Errorf("apply %s %s: %s", e.Type, e.ID, outcome)
	}
	return nil
}

// applyAll applies evs over conns connections of db, each connection the
// events of its accounts in order (an account's transitions after its
// creations, as a queue keeps them).
func applyAll(db *sql.DB, evs []sqlEvent, conns int) error {
	ctx := context.Background()
	lanes := make([][]sqlEvent, conns)
	for _, e := range evs {
		h := sha256.Sum256([]byte(e.From))
		i := int(h[0]) % conns
		lanes[i] = append(lanes[i], e)
	}
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for _, lane := range lanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := db.Conn(ctx)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			for _, e := range lane {
				if err := e.apply(ctx, conn); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// uuidV4 is a random version-4 UUID.
func uuidV4() string {
	b := make([]byte, 16)
	rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// lifecycle returns n events over accounts accounts (named as the
// backlog's, acc_NNNNN), in the prefill's proportions: of every 20, 10
// creations, 9 completions and 1 failure, each transition of a transfer
// created earlier in the list, from the same account.
func lifecycle(n, accounts int, seed uint64) []sqlEvent {
	r := mrand.New(mrand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var out, created []sqlEvent
	for len(out) < n {
		if len(out)%20 < 10 || len(created) == 0 {
			from := r.IntN(accounts)
			to := (from + 1 + r.IntN(accounts-1)) % accounts
			e := sqlEvent{ID: uuidV4(), Type: "TransferCreated", Transfer: uuidV4(),
				From: fmt.Sprintf("acc_%05d", from), To: fmt.Sprintf("acc_%05d", to), Amount: int64(1 + r.IntN(100_000))}
			out, created = append(out, e), append(created, e)
			continue
		}
		t := created[0]
		created = created[1:]
		t.ID, t.Type = uuidV4(), "TransferCompleted"
		if len(out)%20 == 19 {
			t.Type = "TransferFailed"
		}
		out = append(out, t)
	}
	return out
}
