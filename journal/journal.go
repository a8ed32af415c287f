// Package journal keeps what the service acked outside the database, in a
// RabbitMQ stream, so that events a database lost after their ack (a
// failover to a standby that was behind, a point-in-time restore) can be
// applied again (adr/0014).
//
// Each entry is one event as it was delivered, with its queue and a
// sequence number per queue; a transaction's entries travel in one
// message of the stream. The entries are written after the event's
// transaction committed and before the ack; that transaction moved the
// queue's mark in the database (journal_mark) to its last sequence. The
// database thus says exactly which entries it holds: those of the queue
// above its mark are what it lost. A Lane wraps a worker's database lane:
// it numbers and journals what the worker applies, and before the queue's
// first event, and whenever the database does not hold the mark it went on
// from, it applies the queue's missing entries again, in order, first.
package journal

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/event"
)

// DefaultSkew is how long before the database's mark moved a read of the
// journal starts, when Config.Skew is not set: the mark's time is the
// database server's clock and a stream chunk's the broker's, so the two
// may disagree by this much. It only chooses where reading starts; which
// entries are missing is told by their sequences, and clocks further
// apart cost a read from the stream's start, not a loss (adr/0014). What
// a read passes over is every queue's entries of that stretch, so it is
// what a handover under load, or a replica's check, pays.
const DefaultSkew = time.Minute

// Config is a journal's settings.
type Config struct {
	Stream   string // the stream's name (JOURNAL_STREAM)
	MaxAge   string // its x-max-age, e.g. 7D (JOURNAL_MAX_AGE)
	MaxBytes int64  // its x-max-length-bytes (JOURNAL_MAX_BYTES)
	Declare  bool   // declare the stream; else only check that it exists
	// Dial opens a broker connection for the journal.
	Dial func() (*amqp.Connection, error)
	// Spill, when set, keeps a queue's entries in the database while the
	// stream does not take them (appender.go); KeepAfter is how long a
	// write may wait for the stream before its entries are kept there
	// (JOURNAL_KEEP_AFTER). Without it, the acks wait for the stream.
	Spill     event.JournalSpill
	KeepAfter time.Duration
	// Letters is no longer read: a restore writes the letter of an entry
	// the database refuses when applied again, or that no longer
	// decodes, through its lane's ParkMarked (MarkedParker), in the
	// transaction that moves the mark past the entry. A Parker written
	// apart from that move was written again by each retry of a restore
	// cut short between the two.
	//
	// Deprecated: the lane's database parks the letters.
	Letters Parker
	// Skew is how far the database's clock and the broker's may be
	// apart (JOURNAL_CLOCK_SKEW); DefaultSkew when zero.
	Skew time.Duration
	// Reports is what the journal tells the service.
	Reports Reports
}

// Reports is what the journal tells the service; each may be nil. They
// are set before any lane opens, so that every lane, the start's included,
// reports to them.
type Reports struct {
	// Restored counts entries applied again from the journal.
	Restored func(queue string, n int)
	// Stalled is told each time the stream did not take a queue's entries
	// and they could not be kept in the database either (since the first
	// such write, how many tries, the first entry's event), and Healed
	// once they are taken, or the lane closes: the worker's acks wait
	// meanwhile, and the service reports the queue blocked.
	Stalled func(queue string, since time.Time, attempts int, eventID string, err error)
	Healed  func(queue string)
	// Read is told of the bytes of every journal message a read of the
	// stream passed over.
	Read func(bytes int)
	// Unprotected is told of entries kept in the database (n > 0) and of
	// those the stream then took from there (n < 0): while kept, their
	// events, acked, are protected against a failover or a restore only
	// as far as the database is.
	Unprotected func(queue string, n int)
	// Lost is told of acked events whose entries were kept in the
	// database and went with their commits (a failover or a restore took
	// them back before the stream took the entries): in neither the
	// stream nor the database, they cannot be applied again. They are
	// taken off Unprotected too.
	Lost func(queue string, n int)
	// Held is told, for each transaction, how long its entries took from
	// its commit until the stream confirmed them or the database kept
	// them: how long its acks waited for the journal.
	Held func(queue string, wait time.Duration)
}

// Journal writes and reads the stream. It is safe for concurrent use: the
// workers of every queue append through one channel in confirm mode.
type Journal struct {
	cfg Config

	mu   sync.Mutex
	conn *amqp.Connection
	// readConn is the reads' connection (readChannel), which never
	// publishes; readMu guards it.
	readMu   sync.Mutex
	readConn *amqp.Connection
	ch       *amqp.Channel // in confirm mode; nil until opened, and after a failure
	ans      *answers      // ch's answers (publish.go)
	// writes are the lanes' writes, on their way to the one writer that
	// publishes them (combine.go).
	writes    chan *writeReq
	startOnce sync.Once
	quit      chan struct{}
	quitOnce  sync.Once
	// blocked is set while the broker blocks conn's publishes (a memory
	// or disk alarm, connection.blocked): a write then fails at once
	// instead of waiting for the alarm to pass.
	blocked *atomic.Bool
	// pubMu keeps each publish on ch with the delivery tag it reads first.
	pubMu sync.Mutex

	// The watch's (watch.go): the lanes open, the marks the last lane of
	// each queue closed synced at, and its kick.
	lanesMu   sync.Mutex
	lanes     map[*Lane]struct{}
	lastMarks map[string]int64
	lastKept  map[string]bool // the last lane closed with entries kept, or not knowing
	kickOnce  sync.Once
	kick      chan struct{}
}

// errBlocked: the broker blocks the journal's publishes.
var errBlocked = errors.New("the broker blocks publishing (a memory or disk alarm)")

// New returns a journal over cfg; it connects when first used.
func New(cfg Config) *Journal { return &Journal{cfg: cfg} }

// Parker writes a dead letter to the database's outbox (Config.Letters,
// no longer read).
type Parker interface {
	Park(ctx context.Context, l event.OutboxLetter) error
}

// Database is what the journal keeps in the database besides the mark and
// the letters, which its lanes write (MarkedParker).
type Database interface {
	event.JournalSpill
}

// Use has the journal keep a queue's entries in d while the stream does
// not take them (Config.Spill). It must be called before any lane opens.
func (j *Journal) Use(d Database) { j.cfg.Spill = d }

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

// channel returns the publishing channel and its answers, connecting and
// declaring the stream first when there is none.
func (j *Journal) channel() (*amqp.Channel, *answers, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.ch != nil && !j.ch.IsClosed() {
		return j.ch, j.ans, nil
	}
	j.closeLocked()
	conn, err := j.cfg.Dial()
	if err != nil {
		return nil, nil, fmt.Errorf("journal %s: %w", j.cfg.Stream, err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = j.declare(ch)
	}
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		closeConn(conn)
		return nil, nil, fmt.Errorf("journal %s: %w", j.cfg.Stream, err)
	}
	j.conn, j.ch, j.ans, j.blocked = conn, ch, follow(ch), watchBlocked(conn)
	return ch, j.ans, nil
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
		closeConn(j.conn)
	}
	j.conn, j.ch, j.ans, j.blocked = nil, nil, nil, nil
}

// closeConn closes the journal's publishing connection. The broker reads
// nothing more from a connection it blocks (an alarm), not even the close,
// so its answer is waited for a second at most; then the socket is
// dropped. Without the bound, a shutdown during an alarm would hang.
func closeConn(conn *amqp.Connection) {
	_ = conn.CloseDeadline(time.Now().Add(time.Second))
}

// watchBlocked follows conn's connection.blocked and connection.unblocked
// until it closes. The notifications must be read, or the connection
// stops.
func watchBlocked(conn *amqp.Connection) *atomic.Bool {
	b := new(atomic.Bool)
	c := conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	go func() {
		for n := range c {
			b.Store(n.Active)
		}
	}()
	return b
}

// isBlocked reports whether the broker blocks the journal's publishes now.
func (j *Journal) isBlocked() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.blocked != nil && j.blocked.Load()
}

// Close closes the journal's connection.
func (j *Journal) Close() {
	j.stopWriter()
	j.mu.Lock()
	defer j.mu.Unlock()
	j.closeLocked()
	j.readMu.Lock()
	defer j.readMu.Unlock()
	if j.readConn != nil {
		j.readConn.Close()
		j.readConn = nil
	}
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
	// Letter, on a Dead entry: the dead letter that transaction parked
	// in the outbox (a broker alarm held its copy back, Lane.Park). A
	// restore parks it again, since the database lost it with the
	// commit; Event then has only its id and type.
	Letter *event.OutboxLetter
	// Undecodable, on a Dead entry: why the entry's event, applied and
	// acked once, no longer decodes when read back (or its headers do
	// not); Letter is then its dead letter, which a restore parks instead
	// of applying it.
	Undecodable error
}

// answer waits for a publish's answer on ch; a channel that gave no
// confirm, or whose message did not reach the stream, is dropped, and the
// next use opens another, declaring the stream again.
func (j *Journal) answer(ctx context.Context, ch *amqp.Channel, a <-chan error) error {
	select {
	case err := <-a:
		return j.answered(ch, err)
	case <-ctx.Done():
		if j.isBlocked() {
			// The broker holds the publish until the alarm passes, and
			// its confirm then: the channel stays, and the writes tried
			// meanwhile fail at once. The entries will be written again,
			// so the stream may hold them twice; a read takes a sequence
			// once (readAll).
			return fmt.Errorf("journal %s: confirm: %w", j.cfg.Stream, errBlocked)
		}
		j.fail(ch)
		return fmt.Errorf("journal %s: confirm: %w", j.cfg.Stream, ctx.Err())
	}
}

// answered is what a publish's answer err, once it came, means: nil for
// a confirm; otherwise the channel is failed (closed, a new one opened for
// the next write) and err said of the journal.
func (j *Journal) answered(ch *amqp.Channel, err error) error {
	if err != nil {
		j.fail(ch)
		return fmt.Errorf("journal %s: %w", j.cfg.Stream, err)
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
