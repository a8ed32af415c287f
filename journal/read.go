package journal

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Found is what a Read found of a queue's entries.
type Found struct {
	// Entries are those above after, in the stream's order: in a page,
	// those of the page.
	Entries []Entry
	// First is the sequence of the queue's first entry the read saw (0
	// for none), Highest the highest (after, if none is higher).
	First, Highest int64
	// FromStart: the read began at the stream's first entry, whose time
	// is Head (the zero time for an empty stream).
	FromStart bool
	Head      time.Time
}

// Read reads queue's entries above after, and hands them to page as they
// come, up to pageSize at a time, in the stream's order; each page's
// Found also says what the read has seen so far (First, FromStart, Head).
// An error of page ends the read. It starts Config.Skew before since, or at the
// stream's first entry when since is zero, and reads up to a fence it
// appends first, so it sees every entry confirmed before it was called.
// The Found it returns has the read's First and Highest, and no entries.
func (j *Journal) Read(ctx context.Context, queue string, after int64, since time.Time, page func(Found) error) (Found, error) {
	return readOne(ctx, j, queue, after, since, page)
}

// queueRead is one queue's part of a read of the stream, which may read
// several at once (readAll): its entries above after go to page; found
// is what the read saw of the queue.
type queueRead struct {
	after int64
	page  func(Found) error
	found Found
	err   error // page's: the read of this queue ended
	taken seqs  // the sequences above after handed to page so far
}

// take notes e, an entry of qr's queue the read came to, and keeps it for
// the next page when it is above the mark and not a copy of one kept
// before: a write tried again after it had reached the stream
// unconfirmed (a lost confirm, an alarm) leaves its entries there twice.
// A copy is known by its sequence alone: an entry's sequence is taken
// once, by the transaction that commits it.
func (qr *queueRead) take(e Entry) {
	f := &qr.found
	if f.First == 0 {
		f.First = e.Seq
	}
	f.Highest = max(f.Highest, e.Seq)
	if e.Seq > qr.after && !qr.taken.has(e.Seq) {
		qr.taken.add(e.Seq)
		f.Entries = append(f.Entries, e)
	}
}

// unreadable: a message of the queue, holding entries first … last, does
// not parse (its JSON, or its several-queues envelope).
type unreadable struct {
	first, last int64
	offset      any
	err         error
}

func (u *unreadable) Error() string {
	return fmt.Sprintf("the message at offset %v, holding entries %d to %d, does not parse: %v", u.offset, u.first, u.last, u.err)
}

// unreadable notes a message of qr's queue, holding entries first … last,
// that does not parse. One above the mark ends the queue's read, once
// the entries before it are handed over: it returns true then. One at or
// below the mark, or a copy, needs no reading.
func (qr *queueRead) unreadable(first, last int64, offset any, err error) bool {
	f := &qr.found
	if f.First == 0 {
		f.First = first
	}
	if last <= qr.after || (qr.taken.has(first) && qr.taken.has(last)) {
		f.Highest = max(f.Highest, last)
		return false
	}
	// The entries before it go first, and the page judges, as for any
	// entry, whether the read reached back to the mark.
	qr.err = qr.page(*f)
	f.Entries = nil
	if qr.err == nil {
		qr.err = &unreadable{first: first, last: last, offset: offset, err: err}
	}
	return true
}

// seqs is a set of sequences, as sorted runs of consecutive ones: a
// queue's entries come in runs, so the set stays a few runs long however
// many entries a restore reads.
type seqs [][2]int64

func (s seqs) find(n int64) int {
	i, _ := slices.BinarySearchFunc(s, n, func(r [2]int64, n int64) int { return cmp.Compare(r[1], n) })
	return i
}

func (s seqs) has(n int64) bool {
	i := s.find(n)
	return i < len(s) && s[i][0] <= n
}

func (s *seqs) add(n int64) {
	if k := len(*s); k > 0 && (*s)[k-1][1]+1 == n {
		(*s)[k-1][1] = n // the usual case: the next in order
		return
	}
	i := s.find(n)
	*s = slices.Insert(*s, i, [2]int64{n, n})
}

// readOne reads one queue's entries from s (see Journal.Read).
func readOne(ctx context.Context, s store, queue string, after int64, since time.Time, page func(Found) error) (Found, error) {
	qr := &queueRead{after: after, page: page}
	err := s.readAll(ctx, since, map[string]*queueRead{queue: qr})
	if err == nil {
		err = qr.err
	}
	return qr.found, err
}

// readAll is Read for several queues (reads, by queue) in one pass over
// the stream: each queue's entries go to its own page, in the stream's
// order; a queue whose page failed is passed over from then on.
func (j *Journal) readAll(ctx context.Context, since time.Time, reads map[string]*queueRead) error {
	begin(reads, since)
	ch, ans, err := j.channel()
	if err != nil {
		return &unreadError{err}
	}
	fence := make([]byte, 16)
	_, _ = rand.Read(fence)
	id := hex.EncodeToString(fence)
	a, err := j.publish(ctx, ch, ans, amqp.Publishing{
		Headers: amqp.Table{hFence: id}, DeliveryMode: amqp.Persistent, Timestamp: time.Now()})
	if err != nil {
		j.fail(ch)
		return &unreadError{fmt.Errorf("journal %s: fence: %w", j.cfg.Stream, err)}
	}
	if err := j.awaitFence(ctx, ch, a); err != nil {
		return &unreadError{fmt.Errorf("fence: %w", err)}
	}

	rc, err := j.readChannel()
	if err != nil {
		return &unreadError{fmt.Errorf("journal %s: %w", j.cfg.Stream, err)}
	}
	defer rc.Close()
	if err := rc.Qos(readPrefetch, 0, false); err != nil {
		return &unreadError{fmt.Errorf("journal %s: %w", j.cfg.Stream, err)}
	}
	var offset any = "first"
	if !since.IsZero() {
		offset = since.Add(-cmp.Or(j.cfg.Skew, DefaultSkew))
	}
	read := 0 // the bytes of the messages passed over, reported once at the end
	defer func() {
		if j.cfg.Reports.Read != nil {
			j.cfg.Reports.Read(read)
		}
	}()
	deliveries, err := rc.ConsumeWithContext(ctx, j.cfg.Stream, "", false, false, false, false, amqp.Table{"x-stream-offset": offset})
	if err != nil {
		return &unreadError{fmt.Errorf("journal %s: read: %w", j.cfg.Stream, err)}
	}
	open := len(reads) // queues whose page has not failed
	for n := 0; open > 0; n++ {
		var d amqp.Delivery
		var ok bool
		select {
		case d, ok = <-deliveries:
		case <-ctx.Done():
			return fmt.Errorf("journal %s: read: %w", j.cfg.Stream, ctx.Err())
		}
		if !ok {
			return fmt.Errorf("journal %s: the read ended before its fence", j.cfg.Stream)
		}
		_ = d.Ack(true)
		read += len(d.Body)
		if n == 0 {
			headAt(reads, d.Timestamp)
		}
		if fid, _ := d.Headers[hFence].(string); fid == id {
			fenced(reads)
			return nil
		}
		ended, err := takeDelivery(reads, d.Headers, d.Body)
		if err != nil {
			return fmt.Errorf("journal %s: %w", j.cfg.Stream, err)
		}
		open -= ended
	}
	return nil
}

// takeDelivery hands a journal message's entries to the reads of their
// queues: a message of one queue (hQueue), or of several (hQueues). It
// returns how many of those queues' reads it ended (their page failed, or
// their message does not parse), and an error when a message does not
// parse and does not say which entries it holds. An entry that does not
// decode in a message that parses is handed over as such (decode).
func takeDelivery(reads map[string]*queueRead, headers amqp.Table, body []byte) (ended int, err error) {
	offset := headers["x-stream-offset"]
	take := func(q string, entries json.RawMessage, r amqp.Table, decodeErr error) error {
		qr := reads[q]
		if qr == nil || qr.err != nil {
			return nil
		}
		var es []Entry
		if decodeErr == nil {
			es, decodeErr = decode(q, entries)
		}
		if decodeErr != nil {
			first, ok1 := r[hFirst].(int64)
			last, ok2 := r[hLast].(int64)
			if !ok1 || !ok2 || last < first {
				return fmt.Errorf("a message of %s at offset %v: %w", q, offset, decodeErr)
			}
			if qr.unreadable(first, last, offset, decodeErr) {
				ended++
			}
			return nil
		}
		for _, e := range es {
			qr.take(e)
		}
		if f := &qr.found; len(f.Entries) >= pageSize {
			if qr.err = qr.page(*f); qr.err != nil {
				ended++
			}
			f.Entries = nil
		}
		return nil
	}
	several, ok := headers[hQueues].(string)
	if !ok {
		q, _ := headers[hQueue].(string)
		return ended, take(q, body, headers, nil)
	}
	// Several queues' entries: the ranges say which, should the body
	// not decode.
	var ranges map[string][2]int64
	if err := json.Unmarshal([]byte(several), &ranges); err != nil {
		return ended, fmt.Errorf("a message of several queues at offset %v: its %s header: %w", offset, hQueues, err)
	}
	rangeOf := func(q string) amqp.Table { return amqp.Table{hFirst: ranges[q][0], hLast: ranges[q][1]} }
	var parts []struct {
		Q string          `json:"q"`
		E json.RawMessage `json:"e"`
	}
	if perr := json.Unmarshal(body, &parts); perr != nil {
		for q := range ranges {
			if err := take(q, nil, rangeOf(q), perr); err != nil {
				return ended, err
			}
		}
		return ended, nil
	}
	for _, p := range parts {
		if err := take(p.Q, p.E, rangeOf(p.Q), nil); err != nil {
			return ended, err
		}
	}
	return ended, nil
}

// pageSize is about how many entries a Read hands over at a time, and
// readPrefetch how many of the stream's messages (a transaction's entries
// each, up to maxMessage bytes) it lets the broker send ahead: together,
// what a restore holds in memory, whatever the size of the gap.
const (
	pageSize     = 1000
	readPrefetch = 100
)
