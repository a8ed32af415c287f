// Package journal keeps what the service acked outside the database, in a
// RabbitMQ stream, so that events a database lost after their ack (a
// failover to a standby that was behind, a point-in-time restore) can be
// applied again (adr/0014).
//
// Each entry is one event as it was delivered, with its queue and a
// sequence number per queue. The entry is written after the event's
// transaction committed and before the ack; that transaction moved the
// queue's mark in the database (journal_mark) to the entry's sequence. The
// database thus says exactly which entries it holds: those of the queue
// above its mark are what it lost. A Lane wraps a worker's database lane:
// it numbers and journals what the worker applies, and before the queue's
// first event, and whenever the database does not hold the mark it went on
// from, it applies the queue's missing entries again, in order, first.
package journal

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/event"
)

// The headers an entry adds to the event's own.
const (
	hQueue      = "x-journal-queue"
	hSeq        = "x-journal-seq"
	hRoutingKey = "x-journal-routing-key"
	hFence      = "x-journal-fence"
	hDead       = "x-journal-dead-lettered"
)

// Skew is how long before the database's mark moved a read of the journal
// starts: the mark's time is the database server's clock and an entry's
// is the broker's, so the two may disagree by this much. It only chooses
// where reading starts; which entries are missing is told by their
// sequences (adr/0014).
const Skew = 10 * time.Minute

// Config is a journal's settings.
type Config struct {
	Stream   string // the stream's name (JOURNAL_STREAM)
	MaxAge   string // its x-max-age, e.g. 7D (JOURNAL_MAX_AGE)
	MaxBytes int64  // its x-max-length-bytes (JOURNAL_MAX_BYTES)
	Declare  bool   // declare the stream; else only check that it exists
	// Dial opens a broker connection for the journal.
	Dial func() (*amqp.Connection, error)
}

// Journal writes and reads the stream. It is safe for concurrent use: the
// workers of every queue append through one channel in confirm mode.
type Journal struct {
	cfg Config

	mu   sync.Mutex
	conn *amqp.Connection
	ch   *amqp.Channel // in confirm mode; nil until opened, and after a failure
}

// New returns a journal over cfg; it connects when first used.
func New(cfg Config) *Journal { return &Journal{cfg: cfg} }

// Args are the stream's arguments.
func (c Config) Args() amqp.Table {
	args := amqp.Table{"x-queue-type": "stream"}
	if c.MaxAge != "" {
		args["x-max-age"] = c.MaxAge
	}
	if c.MaxBytes > 0 {
		args["x-max-length-bytes"] = c.MaxBytes
	}
	return args
}

// channel returns the publishing channel, connecting and declaring the
// stream first when there is none.
func (j *Journal) channel() (*amqp.Channel, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.ch != nil && !j.ch.IsClosed() {
		return j.ch, nil
	}
	j.closeLocked()
	conn, err := j.cfg.Dial()
	if err != nil {
		return nil, fmt.Errorf("journal %s: %w", j.cfg.Stream, err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = j.declare(ch)
	}
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("journal %s: %w", j.cfg.Stream, err)
	}
	j.conn, j.ch = conn, ch
	return ch, nil
}

// declare declares the stream with its arguments, or with Declare false
// checks that it exists.
func (j *Journal) declare(ch *amqp.Channel) error {
	if !j.cfg.Declare {
		_, err := ch.QueueDeclarePassive(j.cfg.Stream, true, false, false, false, nil)
		return err
	}
	_, err := ch.QueueDeclare(j.cfg.Stream, true, false, false, false, j.cfg.Args())
	return err
}

func (j *Journal) closeLocked() {
	if j.conn != nil {
		j.conn.Close()
	}
	j.conn, j.ch = nil, nil
}

// Close closes the journal's connection.
func (j *Journal) Close() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.closeLocked()
}

// Entry is one journaled event.
type Entry struct {
	Queue string
	Seq   int64
	Event event.Event // decoded again from the delivery it came in
	// Dead: the event was dead-lettered in the transaction that took Seq
	// (a producer conflict): the entry keeps the sequence, and is never
	// applied again, so that no letter is written twice.
	Dead bool
}

// Append writes entries to the stream and returns once the broker
// confirmed every one, or ctx ended.
func (j *Journal) Append(ctx context.Context, entries []Entry) error {
	if len(entries) == 0 {
		return nil
	}
	ch, err := j.channel()
	if err != nil {
		return err
	}
	confirms := make([]*amqp.DeferredConfirmation, len(entries))
	now := time.Now()
	for i, e := range entries {
		m := e.Event.Message
		headers := make(amqp.Table, len(m.Headers)+3)
		for k, v := range m.Headers {
			headers[k] = v
		}
		headers[hQueue], headers[hSeq], headers[hRoutingKey] = e.Queue, e.Seq, m.RoutingKey
		if e.Dead {
			headers[hDead] = true
		}
		confirms[i], err = ch.PublishWithDeferredConfirmWithContext(ctx, "", j.cfg.Stream, false, false, amqp.Publishing{
			Headers: headers, Body: m.Body, MessageId: m.MessageID, ContentType: m.ContentType, Type: e.Event.Type,
			DeliveryMode: amqp.Persistent, Timestamp: now,
		})
		if err != nil {
			j.fail(ch)
			return fmt.Errorf("journal %s: publish: %w", j.cfg.Stream, err)
		}
	}
	for _, c := range confirms {
		acked, err := c.WaitContext(ctx)
		if err != nil {
			j.fail(ch)
			return fmt.Errorf("journal %s: confirm: %w", j.cfg.Stream, err)
		}
		if !acked {
			return fmt.Errorf("journal %s: the broker refused an entry (nack)", j.cfg.Stream)
		}
	}
	return nil
}

// fail drops ch, so that the next use connects again: a channel whose
// confirms were not all answered cannot be trusted with more.
func (j *Journal) fail(ch *amqp.Channel) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.ch == ch {
		j.closeLocked()
	}
}

// Found is what a Read found of a queue's entries.
type Found struct {
	Entries []Entry // those above after, in the stream's order
	// First is the sequence of the queue's first entry the read saw (0
	// for none), Tail the highest (after, if none is higher).
	First, Tail int64
	// FromStart: the read began at the stream's first entry, whose time
	// is Head (the zero time for an empty stream).
	FromStart bool
	Head      time.Time
}

// Read reads queue's entries above after. It starts Skew before since,
// or at the stream's first entry when since is zero, and reads up to a
// fence it appends first, so it sees every entry confirmed before it was
// called.
func (j *Journal) Read(ctx context.Context, queue string, after int64, since time.Time) (Found, error) {
	f := Found{Tail: after, FromStart: since.IsZero()}
	ch, err := j.channel()
	if err != nil {
		return f, err
	}
	fence := make([]byte, 16)
	_, _ = rand.Read(fence)
	id := hex.EncodeToString(fence)
	c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", j.cfg.Stream, false, false, amqp.Publishing{
		Headers: amqp.Table{hFence: id}, DeliveryMode: amqp.Persistent, Timestamp: time.Now()})
	if err == nil {
		var acked bool
		acked, err = c.WaitContext(ctx)
		if err == nil && !acked {
			err = errors.New("the broker refused the fence (nack)")
		}
	}
	if err != nil {
		j.fail(ch)
		return f, fmt.Errorf("journal %s: fence: %w", j.cfg.Stream, err)
	}

	j.mu.Lock()
	conn := j.conn
	j.mu.Unlock()
	if conn == nil {
		return f, fmt.Errorf("journal %s: the connection closed", j.cfg.Stream)
	}
	rc, err := conn.Channel()
	if err != nil {
		return f, fmt.Errorf("journal %s: %w", j.cfg.Stream, err)
	}
	defer rc.Close()
	if err := rc.Qos(1000, 0, false); err != nil {
		return f, fmt.Errorf("journal %s: %w", j.cfg.Stream, err)
	}
	var offset any = "first"
	if !since.IsZero() {
		offset = since.Add(-Skew)
	}
	deliveries, err := rc.ConsumeWithContext(ctx, j.cfg.Stream, "", false, false, false, false, amqp.Table{"x-stream-offset": offset})
	if err != nil {
		return f, fmt.Errorf("journal %s: read: %w", j.cfg.Stream, err)
	}
	for n := 0; ; n++ {
		var d amqp.Delivery
		var ok bool
		select {
		case d, ok = <-deliveries:
		case <-ctx.Done():
			return f, fmt.Errorf("journal %s: read: %w", j.cfg.Stream, ctx.Err())
		}
		if !ok {
			return f, fmt.Errorf("journal %s: the read ended before its fence", j.cfg.Stream)
		}
		_ = d.Ack(true)
		if n == 0 {
			f.Head = d.Timestamp
		}
		if fid, _ := d.Headers[hFence].(string); fid == id {
			return f, nil
		}
		if q, _ := d.Headers[hQueue].(string); q != queue {
			continue
		}
		seq, ok := sequence(d.Headers[hSeq])
		if !ok {
			continue
		}
		if f.First == 0 {
			f.First = seq
		}
		f.Tail = max(f.Tail, seq)
		if seq <= after {
			continue
		}
		e, err := entry(queue, seq, d)
		if err != nil {
			return f, fmt.Errorf("journal %s: entry %d of %s: %w", j.cfg.Stream, seq, queue, err)
		}
		f.Entries = append(f.Entries, e)
	}
}

// sequence reads an entry's sequence header.
func sequence(v any) (int64, bool) {
	switch n := v.(type) {
	case int64:
		return n, true
	case int32:
		return int64(n), true
	case string:
		s, err := strconv.ParseInt(n, 10, 64)
		return s, err == nil
	}
	return 0, false
}

// entry decodes a journal delivery back into the event it holds, with
// the message it was first delivered in.
func entry(queue string, seq int64, d amqp.Delivery) (Entry, error) {
	ev, err := event.Decode(d.Body, d.MessageId, d.Type)
	if err != nil {
		return Entry{}, err
	}
	headers := make(amqp.Table, len(d.Headers))
	for k, v := range d.Headers {
		switch k {
		case hQueue, hSeq, hRoutingKey, hDead, "x-stream-offset":
		default:
			headers[k] = v
		}
	}
	key, _ := d.Headers[hRoutingKey].(string)
	ev.Message = event.Message{RoutingKey: key, Body: d.Body, Headers: headers, MessageID: d.MessageId, ContentType: d.ContentType}
	dead, _ := d.Headers[hDead].(bool)
	return Entry{Queue: queue, Seq: seq, Event: ev, Dead: dead}, nil
}
