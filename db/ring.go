package db

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// Ring is the inbox's ring of partitions (sql/0011, adr/0009): Slots
// partitions of processed_event, each taking the claims of one Width of
// time in turn, the day number modulo Slots.
type Ring struct {
	Slots int
	Width time.Duration
}

// Covers returns the longest INBOX_TTL the ring keeps exactly: one slot is
// being written and one waits for retention to empty it before the ring
// comes back to it, so Slots-2 widths. Retention never empties a slot that
// holds a row younger than the TTL; with a longer TTL it empties a slot
// only if the slot's turn leaves time to, and otherwise leaves it, so the
// slot then holds two rounds of rows (nothing is forgotten early, the
// inbox grows).
func (r Ring) Covers() time.Duration { return time.Duration(r.Slots-2) * r.Width }

// ReadRing returns the ring's size as migrate made it.
func ReadRing(ctx context.Context, db sqlx.QueryerContext) (Ring, error) {
	var v struct {
		Slots int `db:"slots"`
		Width int `db:"width_seconds"`
	}
	if err := sqlx.GetContext(ctx, db, &v, `SELECT slots, width_seconds FROM inbox_ring`); err != nil {
		return Ring{}, fmt.Errorf("read the inbox ring: %w", translate(err))
	}
	return Ring{Slots: v.Slots, Width: time.Duration(v.Width) * time.Second}, nil
}

// RingWarning is what the log and /readyz say when INBOX_TTL is longer
// than the ring covers, or "" when it is not.
func RingWarning(r Ring, ttl time.Duration) string {
	if r.Slots == 0 || ttl <= r.Covers() {
		return ""
	}
	return fmt.Sprintf("INBOX_TTL (%s) is longer than the inbox ring covers (%d slots of %s: %s): "+
		"no applied eventId is forgotten early, but retention cannot empty a slot before the ring comes back to it, so the inbox grows; "+
		"lower INBOX_TTL, or have the schema's owner make a ring that covers it (adr/0009)", ttl, r.Slots, r.Width, r.Covers())
}

// slotPartition is the name of slot's partition, as sql/0011 made it.
func slotPartition(slot int) string { return fmt.Sprintf("processed_event_s%02d", slot) }

// dueSQL lists the slots whose every row is older than $1 (an interval)
// and that the claims have not reached again: the latest day d that maps
// to the slot ended more than the TTL ago, and the ring's turn at d+slots
// is still ahead (its start is returned, as until). A slot holding rows of
// an earlier round too (retention missed its turn) holds only older ones.
const dueSQL = `
	SELECT s.slot, to_timestamp((l.d + r.slots) * r.width_seconds) AS until
	FROM inbox_ring r
	CROSS JOIN LATERAL (SELECT floor(extract(epoch FROM now()) / r.width_seconds)::bigint AS today) n
	CROSS JOIN LATERAL generate_series(0, r.slots - 1) s(slot)
	CROSS JOIN LATERAL (SELECT n.today - ((n.today - s.slot) % r.slots + r.slots) % r.slots AS d) l
	WHERE l.d <> n.today AND to_timestamp((l.d + 1) * r.width_seconds) <= now() - $1::interval
	ORDER BY s.slot`

// dueSlot is one row of dueSQL.
type dueSlot struct {
	Slot  int       `db:"slot"`
	Until time.Time `db:"until"`
}

// truncateSlot empties slot's partition, if it holds rows, in its own
// transaction: under the prune lock (false when another replica holds
// it), waiting at most lockTimeout for the partition (the claims in
// flight hold it for the few milliseconds of their transactions, and new
// claims queue behind the wait, so it must be short). Once the partition
// is held, no claim can write to it until the commit, so the clock is read
// again: a slot whose turn came meanwhile is left alone. It returns
// whether it ran (the lock was free) and whether it emptied the slot.
func truncateSlot(ctx context.Context, db *sqlx.DB, s dueSlot, lockTimeout time.Duration) (ran, emptied bool, err error) {
	part := pq.QuoteIdentifier(slotPartition(s.Slot))
	var rows bool
	if err := db.GetContext(ctx, &rows, `SELECT EXISTS (SELECT 1 FROM `+part+`)`); err != nil || !rows {
		return true, false, err
	}
	err = inTx(ctx, db, func(tx *sqlx.Tx) error {
		if err := tx.GetContext(ctx, &ran, `SELECT pg_try_advisory_xact_lock($1)`, pruneLock); err != nil || !ran {
			return err
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, lockTimeout.Milliseconds())); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `LOCK TABLE `+part+` IN ACCESS EXCLUSIVE MODE`); err != nil {
			return err
		}
		var inTime bool
		if err := tx.GetContext(ctx, &inTime, `SELECT clock_timestamp() < $1`, s.Until); err != nil || !inTime {
			return err
		}
		if _, err := tx.ExecContext(ctx, `TRUNCATE `+part); err != nil {
			return err
		}
		emptied = true
		return nil
	})
	return ran, emptied && err == nil, err
}
