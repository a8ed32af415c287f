package db

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"transferconsumer/event"
)

// outboxBatch is how many dead letters one drain transaction takes.
const outboxBatch = 50

// DrainOutbox hands each dead letter that an apply_event transaction left in
// dead_letter_outbox to publish, and deletes it once publish returned nil,
// in the same transaction. Rows are taken with SKIP LOCKED, so replicas
// draining at once never publish the same row twice at the same time; a
// publish that fails rolls the batch back, and what it had published goes
// out again at the next drain (at least once). It returns how many it
// published and deleted, and implements consumer.Outbox.
func (in *Inbox) DrainOutbox(ctx context.Context, publish func(event.OutboxLetter) error) (int, error) {
	total := 0
	for {
		n := 0
		err := inTx(ctx, in.db, func(tx *sqlx.Tx) error {
			var rows []struct {
				ID          int64     `db:"id"`
				EventID     *string   `db:"event_id"`
				Queue       *string   `db:"queue"`
				CreatedAt   time.Time `db:"created_at"`
				EventType   string    `db:"event_type"`
				Class       string    `db:"class"`
				Reason      string    `db:"reason"`
				RoutingKey  string    `db:"routing_key"`
				Body        []byte    `db:"body"`
				Headers     *string   `db:"headers"`
				MessageID   *string   `db:"message_id"`
				ContentType *string   `db:"content_type"`
			}
			if err := tx.SelectContext(ctx, &rows, `
				SELECT id, event_id, queue, created_at, event_type, class, reason, routing_key, body, headers, message_id, content_type
				FROM dead_letter_outbox ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED`, outboxBatch); err != nil {
				return fmt.Errorf("read dead_letter_outbox: %w", err)
			}
			for _, r := range rows {
				l := event.OutboxLetter{EventID: deref(r.EventID), EventType: r.EventType, Class: r.Class, Reason: r.Reason,
					RoutingKey: r.RoutingKey, Body: r.Body, MessageID: deref(r.MessageID), ContentType: deref(r.ContentType),
					Queue: deref(r.Queue), At: r.CreatedAt, Parked: r.Queue != nil}
				if r.Headers != nil {
					l.Headers = loadedHeaders([]byte(*r.Headers))
				}
				if err := publish(l); err != nil {
					return fmt.Errorf("publish dead letter of event %s: %w", deref(r.EventID), err)
				}
				if _, err := tx.ExecContext(ctx, `DELETE FROM dead_letter_outbox WHERE id = $1`, r.ID); err != nil {
					return fmt.Errorf("delete dead letter %d: %w", r.ID, err)
				}
				n++
			}
			return nil
		})
		if err != nil {
			return total, translate(err)
		}
		total += n
		if n < outboxBatch {
			return total, nil
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Park writes l to dead_letter_outbox, from where the drain publishes it:
// the service parks a dead letter there when a broker alarm holds its copy
// back, and then acks the message (adr/0002). It returns the database's
// errors, translated.
//
// The letter is written as literals (writeLetterInsert), so that the
// INSERT is one simple-protocol Query message, as an attempt is: with
// parameters, outside a transaction, lib/pq would send it in two
// exchanges (Parse, then Bind and Execute), which PgBouncer in
// transaction mode may hand to two server connections
// (TestParkIsOneRoundTrip).
func (in *Inbox) Park(ctx context.Context, l event.OutboxLetter) error {
	var q strings.Builder
	writeLetterInsert(&q, l)
	q.WriteString(" RETURNING id")
	var id int64
	if err := in.db.GetContext(ctx, &id, q.String()); err != nil {
		return translate(fmt.Errorf("park the dead letter of event %s: %w", l.EventID, err))
	}
	if l.Abandoned != nil {
		in.holdParked(ctx, id, l.Abandoned)
	}
	return nil
}

// writeLetterInsert writes the INSERT of lt into dead_letter_outbox, its
// values as literals in a SELECT list, for the caller to end (a FROM
// clause, RETURNING): Park's and ParkMarked's one definition of a
// letter's row. An event id that is not a UUID is NULL, as are an empty
// message id and content type; text is kept as a text column keeps it
// (storableText), headers as jsonb does (storableHeaders).
func writeLetterInsert(b *strings.Builder, lt event.OutboxLetter) {
	b.WriteString("INSERT INTO dead_letter_outbox (event_id, queue, event_type, class, reason, routing_key, body, headers, message_id, content_type) SELECT ")
	if event.IsUUID(lt.EventID) {
		writeText(b, lt.EventID)
		b.WriteString("::uuid")
	} else {
		b.WriteString("NULL")
	}
	for _, v := range []string{lt.Queue, lt.EventType, lt.Class, lt.Reason, lt.RoutingKey} {
		b.WriteString(", ")
		writeText(b, storableText(v))
	}
	b.WriteString(", ")
	writeBytes(b, lt.Body)
	b.WriteString(", ")
	if h := storableHeaders(lt.Headers); len(h) > 0 {
		writeText(b, string(h))
		b.WriteString("::jsonb")
	} else {
		b.WriteString("NULL")
	}
	for _, v := range []string{lt.MessageID, lt.ContentType} {
		b.WriteString(", NULLIF(")
		writeText(b, storableText(v))
		b.WriteString(", '')")
	}
}

// holdParked keeps the parked letter id from the drain (whose SKIP LOCKED
// passes over a locked row) until answer comes: the answer to a publish of
// the same letter that an alarm cut short. A confirm deletes the row, so
// that the DLQ does not hold the letter twice; anything else releases it
// for the drain. Should a drain have taken the row between its insert and
// the lock (SKIP LOCKED: the worker does not wait for it), or the lock's
// connection be lost meanwhile, the drain publishes the letter, and the DLQ
// may hold it twice, never zero times.
//
// The transaction outlives ctx (which bounds the lock's statement only): a
// transaction whose context ends is rolled back.
func (in *Inbox) holdParked(ctx context.Context, id int64, answer <-chan error) {
	tx, err := in.db.BeginTxx(context.WithoutCancel(ctx), readCommitted)
	if err != nil {
		return
	}
	var locked int64
	if err := tx.QueryRowxContext(ctx, `SELECT id FROM dead_letter_outbox WHERE id = $1 FOR UPDATE SKIP LOCKED`, id).Scan(&locked); err != nil {
		_ = tx.Rollback()
		return
	}
	go func() {
		if err := <-answer; err != nil {
			_ = tx.Rollback()
			return
		}
		if _, err := tx.Exec(`DELETE FROM dead_letter_outbox WHERE id = $1`, id); err != nil {
			_ = tx.Rollback()
			return
		}
		_ = tx.Commit()
	}()
}
