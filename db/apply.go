package db

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"transferconsumer/event"
)

// Inbox applies events to the balance projection and the transfers'
// states, each exactly once in effect. It implements consumer.Applier and
// consumer.Lanes.
type Inbox struct {
	db      *sqlx.DB
	maxOpen int          // db's MaxOpenConnections, 0 for no limit
	pinned  atomic.Int64 // connections the lanes hold between events
}

// NewInbox returns an Inbox over db.
func NewInbox(db *sqlx.DB) *Inbox {
	in := &Inbox{db: db}
	if db != nil {
		in.maxOpen = db.Stats().MaxOpenConnections
	}
	return in
}

// Apply claims ev.ID in the inbox and applies its effect in the same local
// transaction, then commits. The work is one call of the apply_event
// function (sql/functions/apply_event.sql), sent with its transaction's
// settings in one Query message: an event costs one round trip (see Lane
// and run).
//
// The claim comes first and is an INSERT, not a lookup: two deliveries of one
// event racing each other both try to insert, the primary key lets exactly
// one win, and the loser waits for the winner's commit and finds the row. A
// check-then-insert would let both decide to apply. Because claim and effect
// share the transaction, a failed effect rolls the claim back too, and the
// redelivery applies it.
//
// It returns Result{Duplicate: true} when ev.ID was applied before with the
// same content; an event.Conflict error when it was applied with other
// content (after recording the conflict in producer_conflict); an
// event.Transition error when a lifecycle event contradicts its transfer
// (nothing is written then, the claim included); an event.Transient error
// when the database is unreachable or asks for a retry (serialization
// failure, deadlock), or when ctx ended the attempt; any other error as is.
//
// Apply takes a connection for this one call; a worker applying event after
// event uses a Lane, which keeps its connection.
func (in *Inbox) Apply(ctx context.Context, ev event.Event) (event.Result, error) {
	l := in.Lane(0)
	defer l.Close()
	return l.Apply(ctx, ev)
}

// Lane returns an event.Lane (the consumer's Lanes port): it applies one
// worker's events, one at a time, on a connection it keeps between them,
// and bounds each attempt by timeout on the server (0: by the role's
// statement_timeout, if it has one), and by the context given to Apply.
//
// Nothing a lane does outlives a transaction on the server, so it works the
// same against PostgreSQL, behind PgBouncer in session mode and behind
// PgBouncer in transaction mode, where each transaction may run on another
// server connection: an attempt is one Query message that is its own
// transaction, with its isolation and its statement_timeout set inside it
// (run), never prepared by name to be found again later. The timeout is
// the server's, which ends the work and never the commit; the lane sends no
// cancel request at all, so none can reach a commit that waits for a
// synchronous standby. When the context given to Apply ends, the lane
// closes its connection instead, and the server ends the statement at its
// timeout.
func (in *Inbox) Lane(timeout time.Duration) event.Lane {
	return &lane{in: in, timeout: timeout}
}

// keepConns reports whether a lane may keep its connection after an event:
// only while another connection is left for everyone else (another lane,
// the readiness check, retention). With a pool smaller than the queues
// (DB_MAX_CONNS), or shared, the last lanes to take one return it after
// every event, so that no queue waits on a connection a lane sits on. It
// counts the lanes' connections itself rather than asking the pool
// (db.Stats takes the pool's lock), since it is asked after every event.
func (in *Inbox) keepConns() bool {
	return in.maxOpen == 0 || int64(in.maxOpen)-in.pinned.Load() >= 1
}

func (l *lane) Apply(ctx context.Context, ev event.Event) (event.Result, error) {
	var outcome string
	call := func(b *strings.Builder) error { writeEventCall(b, ev); return nil }
	if err := l.run(ctx, call, &outcome); err != nil {
		return event.Result{}, fmt.Errorf("apply event %s: %w", ev.ID, translate(err))
	}
	o := result(ev, outcome)
	return o.Result, o.Err
}

// ApplyBatch applies evs in one transaction: one call of apply_batch
// (sql/functions/apply_batch.sql), which claims them all in one statement and applies their
// effects in order. It returns one outcome per event, as Apply would have
// (a duplicate, or a producer conflict for that event alone); an error
// means nothing of the batch was committed, classified as Apply's are: a
// transition that contradicts its transfer or data the database refuses
// is then one of the events, which the caller finds by splitting the
// batch. It implements consumer.BatchLane.
func (l *lane) ApplyBatch(ctx context.Context, evs []event.Event) ([]event.Outcome, error) {
	return l.applyBatch(ctx, evs, nil)
}

func (l *lane) applyBatch(ctx context.Context, evs []event.Event, m *event.Mark) ([]event.Outcome, error) {
	var outcomes pq.StringArray
	args := batchArgs(evs)
	call := func(b *strings.Builder) error {
		if err := inlineCall(b, "apply_batch", args); err != nil {
			return err
		}
		writeMark(b, m)
		return nil
	}
	if err := l.run(ctx, call, &outcomes); err != nil {
		return nil, fmt.Errorf("apply a batch of %d events from %s: %w", len(evs), evs[0].ID, translate(err))
	}
	if len(outcomes) != len(evs) {
		return nil, fmt.Errorf("apply_batch answered %d outcomes for %d events", len(outcomes), len(evs))
	}
	out := make([]event.Outcome, len(evs))
	for i, ev := range evs {
		out[i] = result(ev, outcomes[i])
	}
	return out, nil
}

// ApplyMarked applies evs as ApplyBatch does (one event as Apply does, its
// error as its outcome when the transaction committed), and moves the
// journal's mark from m.Prev to m.Last in the same transaction and the
// same round trip: the call reads FROM journal_advance(…), which runs
// before the events are applied, so a gap (event.ErrJournalGap) fails the
// attempt before it applies anything. With no events it moves the mark
// alone. It implements event.MarkedLane.
func (l *lane) ApplyMarked(ctx context.Context, evs []event.Event, m event.Mark) ([]event.Outcome, error) {
	switch len(evs) {
	case 0:
		var moved bool
		call := func(b *strings.Builder) error { b.WriteString("SELECT true"); writeMark(b, &m); return nil }
		if err := l.run(ctx, call, &moved); err != nil {
			return nil, fmt.Errorf("move the journal mark of %s to %d: %w", m.Queue, m.Last, translate(err))
		}
		return nil, nil
	case 1:
		ev := evs[0]
		var outcome string
		call := func(b *strings.Builder) error { writeEventCall(b, ev); writeMark(b, &m); return nil }
		if err := l.run(ctx, call, &outcome); err != nil {
			return nil, fmt.Errorf("apply event %s: %w", ev.ID, translate(err))
		}
		return []event.Outcome{result(ev, outcome)}, nil
	default:
		return l.applyBatch(ctx, evs, &m)
	}
}

// writeMark ends a call with the FROM clause that moves m, if any.
func writeMark(b *strings.Builder, m *event.Mark) {
	if m == nil {
		return
	}
	b.WriteString(" FROM journal_advance(")
	writeText(b, m.Queue)
	b.WriteString(", ")
	writeInt(b, m.Prev)
	b.WriteString(", ")
	writeInt(b, m.Last)
	if m.Restore {
		b.WriteString(", true")
	}
	b.WriteByte(')')
}

// Marked returns queue's journal mark as the database holds it. It
// implements event.MarkedLane.
//
// The queue is written as a literal, as an attempt writes its own, so that
// the read is one simple-protocol Query message: with a parameter, lib/pq
// would send it in two exchanges (Parse, then Bind and Execute), which
// PgBouncer in transaction mode may hand to two server connections
// (TestMarkedIsOneRoundTrip).
func (l *lane) Marked(ctx context.Context, queue string) (int64, time.Time, error) {
	var mark struct {
		Seq int64     `db:"seq"`
		At  time.Time `db:"at"`
	}
	var q strings.Builder
	q.WriteString("SELECT seq, at FROM journal_mark WHERE queue = ")
	writeText(&q, queue)
	err := l.in.db.GetContext(ctx, &mark, q.String())
	if errors.Is(err, sql.ErrNoRows) {
		return 0, time.Time{}, nil
	}
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("read the journal mark of %s: %w", queue, translate(err))
	}
	if mark.At.Unix() <= 0 {
		// A row a restore made (journal_advance): no time, as with no
		// row, and the read starts at the stream's first entry.
		return mark.Seq, time.Time{}, nil
	}
	return mark.Seq, mark.At, nil
}

// result reads apply_event's answer for ev.
func result(ev event.Event, outcome string) event.Outcome {
	switch {
	case outcome == "applied":
		return event.Outcome{}
	case outcome == "applied+outbox":
		return event.Outcome{Result: event.Result{Outbox: true}}
	case outcome == "duplicate":
		return event.Outcome{Result: event.Result{Duplicate: true}}
	case strings.HasPrefix(outcome, "conflict:"):
		return event.Outcome{Err: event.Conflict(fmt.Errorf(
			"producer conflict: event %s was applied with content fingerprint %s, this delivery has %x",
			ev.ID, strings.TrimPrefix(outcome, "conflict:"), ev.Fingerprint))}
	}
	return event.Outcome{Err: fmt.Errorf("apply event %s: unexpected outcome %q", ev.ID, outcome)}
}

// message is what a transition keeps of its delivery, in case it waits for
// its creation and then contradicts it (apply_effect, in
// sql/functions/apply_effect.sql); a creation never needs
// it, and passes NULLs.
type message struct {
	key, id, contentType sql.NullString
	body, headers        []byte
}

func messageOf(ev event.Event) message {
	if ev.Type == event.TransferCreated {
		return message{}
	}
	m := ev.Message
	return message{
		key: valid(storableText(m.RoutingKey)), id: valid(m.MessageID), contentType: valid(storableText(m.ContentType)),
		body: m.Body, headers: storableHeaders(event.HeadersJSON(m.Headers)),
	}
}

func valid(s string) sql.NullString { return sql.NullString{String: s, Valid: true} }

// writeEventCall writes apply_event's call for ev, its arguments as
// literals (see writeLiteral), each written as it is, with no []any to box
// them in: an event is applied this way once per attempt.
func writeEventCall(b *strings.Builder, ev event.Event) {
	t, m := ev.Transfer, messageOf(ev)
	b.WriteString("SELECT apply_event(")
	writeText(b, ev.ID)
	b.WriteString(", ")
	writeText(b, ev.Type)
	b.WriteString(", ")
	writeBytes(b, ev.Fingerprint)
	b.WriteString(", ")
	writeText(b, t.ID)
	b.WriteString(", ")
	writeText(b, t.FromAccount)
	b.WriteString(", ")
	writeText(b, t.ToAccount)
	b.WriteString(", ")
	writeInt(b, t.AmountMinor)
	b.WriteString(", ")
	writeText(b, t.Currency)
	b.WriteString(", ")
	writeNullText(b, m.key)
	b.WriteString(", ")
	writeBytes(b, m.body)
	b.WriteString(", ")
	writeNullText(b, jsonb(m.headers))
	b.WriteString(", ")
	writeNullText(b, m.id)
	b.WriteString(", ")
	writeNullText(b, m.contentType)
	b.WriteByte(')')
}

// batchArgs are apply_batch's arguments for evs: one array per column.
func batchArgs(evs []event.Event) []any {
	n := len(evs)
	var (
		ids, types, transfers, froms, tos, currencies = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		fingerprints, bodies                          = make([][]byte, n), make([][]byte, n)
		amounts                                       = make([]int64, n)
		keys, headers, msgIDs, contentTypes           = make([]sql.NullString, n), make([]sql.NullString, n), make([]sql.NullString, n), make([]sql.NullString, n)
	)
	for i, ev := range evs {
		t, m := ev.Transfer, messageOf(ev)
		ids[i], types[i], fingerprints[i], transfers[i] = ev.ID, ev.Type, ev.Fingerprint, t.ID
		froms[i], tos[i], amounts[i], currencies[i] = t.FromAccount, t.ToAccount, t.AmountMinor, t.Currency
		keys[i], bodies[i], msgIDs[i], contentTypes[i] = m.key, m.body, m.id, m.contentType
		if m.headers != nil {
			headers[i] = valid(string(m.headers))
		}
	}
	return []any{pq.Array(ids), pq.Array(types), pq.ByteaArray(fingerprints), pq.Array(transfers),
		pq.Array(froms), pq.Array(tos), pq.Array(amounts), pq.Array(currencies),
		pq.Array(keys), pq.ByteaArray(bodies), pq.Array(headers), pq.Array(msgIDs), pq.Array(contentTypes)}
}

// jsonb passes JSON bytes as a jsonb parameter: as text, or NULL when there
// are none (a []byte would be sent as bytea).
func jsonb(b []byte) sql.NullString {
	return sql.NullString{String: string(b), Valid: b != nil}
}
