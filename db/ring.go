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
		"lower INBOX_TTL, or have the schema's owner run `transferconsumer migrate` with it, which grows the ring (adr/0009)", ttl, r.Slots, r.Width, r.Covers())
}

// slotPartition is the name of slot's partition, as sql/0011 made it.
func slotPartition(slot int) string { return fmt.Sprintf("processed_event_s%02d", slot) }

// dueSQL lists the slots whose every row is older than $1 (an interval)
// and that the claims have not reached again: the latest day d that maps
// to the slot ended more than the TTL ago, and the ring's turn at d+slots
// is still ahead (its start is returned, as until). A slot holding rows of
// an earlier round too (retention missed its turn) holds only older ones.
// After the ring grew (SizeRing), no slot is due until every row placed by
// the smaller ring's formula is older than the TTL.
const dueSQL = `
	SELECT s.slot, to_timestamp((l.d + r.slots) * r.width_seconds) AS until
	FROM inbox_ring r
	CROSS JOIN LATERAL (SELECT floor(extract(epoch FROM now()) / r.width_seconds)::bigint AS today) n
	CROSS JOIN LATERAL generate_series(0, r.slots - 1) s(slot)
	CROSS JOIN LATERAL (SELECT n.today - ((n.today - s.slot) % r.slots + r.slots) % r.slots AS d) l
	WHERE l.d <> n.today AND to_timestamp((l.d + 1) * r.width_seconds) <= now() - $1::interval
	  AND r.resized_at <= now() - $1::interval
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

// SlotsFor returns the size of a ring of slots of width that keeps ttl:
// the TTL's slots, one being written, and one waiting to be emptied.
func SlotsFor(ttl, width time.Duration) int {
	return int((ttl+width-1)/width) + 2
}

// SizeRing grows the inbox ring so that it covers ttl (adr/0009), and
// returns the ring as it then is and whether it grew. It needs the
// schema's owner: the owner's `migrate` runs it. It never shrinks the ring
// (a partition dropped would take the rows of its day with it): a ring
// larger than ttl needs is kept.
//
// Growing makes the partitions of the new slots, gives TRUNCATE on them to
// every role that has it on the ring's first slot, and records the ring's
// new size and when it changed, all in one transaction. It takes inbox_ring
// in ACCESS EXCLUSIVE mode first, so the claims that computed a slot with
// the old size have committed before the new size is written, and those
// after wait a moment and read the new one; resized_at, read after the
// lock, is later than every row placed by the old formula, and retention
// empties nothing until those are all older than the TTL (dueSQL): with a
// new size the formula maps a day to another slot, and a slot may hold
// rows the new formula does not expect there.
func SizeRing(ctx context.Context, db *sqlx.DB, ttl time.Duration) (Ring, bool, error) {
	var ring Ring
	grown := false
	err := inTx(ctx, db, func(tx *sqlx.Tx) error {
		if _, err := tx.ExecContext(ctx, `SET LOCAL lock_timeout = 2000`); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `LOCK TABLE inbox_ring IN ACCESS EXCLUSIVE MODE`); err != nil {
			return err
		}
		r, err := ReadRing(ctx, tx)
		if err != nil {
			return err
		}
		ring = r
		want := SlotsFor(ttl, r.Width)
		if want <= r.Slots {
			return nil
		}
		if want > 1000 {
			return fmt.Errorf("INBOX_TTL %s needs a ring of %d slots of %s; more than 1000 is refused", ttl, want, r.Width)
		}
		var roles []string
		if err := tx.SelectContext(ctx, &roles, `SELECT DISTINCT grantee FROM information_schema.role_table_grants
			WHERE table_schema = current_schema() AND table_name = $1 AND privilege_type = 'TRUNCATE'
			  AND grantee <> current_user AND grantee <> 'PUBLIC'`, slotPartition(0)); err != nil {
			return err
		}
		for slot := r.Slots; slot < want; slot++ {
			part := pq.QuoteIdentifier(slotPartition(slot))
			if _, err := tx.ExecContext(ctx, fmt.Sprintf(`CREATE TABLE %s PARTITION OF processed_event FOR VALUES IN (%d)`, part, slot)); err != nil {
				return err
			}
			for _, role := range roles {
				if _, err := tx.ExecContext(ctx, `GRANT TRUNCATE ON `+part+` TO `+pq.QuoteIdentifier(role)); err != nil {
					return err
				}
			}
		}
		if _, err := tx.ExecContext(ctx, `UPDATE inbox_ring SET slots = $1, resized_at = clock_timestamp()`, want); err != nil {
			return err
		}
		ring.Slots, grown = want, true
		return nil
	})
	if lockTimedOut(err) {
		return ring, false, fmt.Errorf("grow the inbox ring: inbox_ring stayed busy for 2 s; run migrate again: %w", translate(err))
	}
	if err != nil {
		return ring, false, fmt.Errorf("grow the inbox ring: %w", translate(err))
	}
	return ring, grown, nil
}
