package journal

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/event"
)

// The models the journal's tests run a lane against: the database's side
// of a lane and the journal's stream, and the helpers that apply through
// a lane as the worker does.

// database is a model of the database's side of a lane: the events it
// applied, in order, and each queue's mark, moved as journal_advance moves
// it. lose takes back its last commits, as a failover to a standby behind
// or a restore does.
type database struct {
	// mu guards mark and commits, which the spill reads from the lane's
	// writer's goroutine; the lane's worker, which writes them, reads
	// them without it.
	mu      sync.Mutex
	applied []string // event ids, in the order applied
	mark    int64
	at      time.Time
	commits []commit // to take back
	refuse  map[string]error
	conflic map[string]bool // answered as a producer conflict, committed
	down    error
	before  func() // runs once, at the next ApplyMarked or ParkMarked
	// vouching runs once, at the next Vouched, before it answers:
	// another reader's commit meanwhile.
	vouching func()
	txs      int // transactions that applied events
	// outbox is the database's dead_letter_outbox: the letters parked,
	// in order; a commit taken back takes its letter out. outboxDown
	// refuses every letter.
	outbox     []event.OutboxLetter
	outboxDown error
	// cut: the commits that move the mark to a sequence fail, so many
	// times each, as a connection cut before the COMMIT: nothing of them
	// is written.
	cut map[int64]int
	// vouched: a read of the journal vouched for the mark (Vouch), the
	// database has lost no commit since (lose forgets it), and no
	// restore moved it since (a restore's move forgets it, as
	// journal_advance's does).
	vouched bool
	vouches int
}

type commit struct {
	mark    int64
	at      time.Time
	applied int
	letters int
}

// lose takes back the last n commits, and returns how many it keeps.
func (d *database) lose(n int) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.commits[len(d.commits)-n]
	d.commits = d.commits[:len(d.commits)-n]
	d.mark, d.at, d.applied, d.outbox = c.mark, c.at, d.applied[:c.applied], d.outbox[:c.letters]
	d.vouched = false // a failover or a restore changes what Vouched reads
	return len(d.commits)
}

// loseKept takes back the last n commits, as lose does, and the journal
// messages k kept after the first of them, as a failover or a restore
// takes every later write with it; it returns those messages. (Rows the
// stream took and the writer deleted since stay deleted: a real loss
// would bring them back, and the writer would write them again.)
func (d *database) loseKept(n int, k *spill) []event.Spilled {
	k.mu.Lock()
	defer k.mu.Unlock()
	held := d.lose(n)
	var gone []event.Spilled
	for i := 0; i < len(k.msgs); {
		if k.at[i] > held {
			gone = append(gone, k.msgs[i])
			k.msgs, k.at = slices.Delete(k.msgs, i, i+1), slices.Delete(k.at, i, i+1)
			continue
		}
		i++
	}
	return gone
}

// committed records a commit about to be made, for lose.
func (d *database) committed() {
	d.commits = append(d.commits, commit{d.mark, d.at, len(d.applied), len(d.outbox)})
}

// cutShort fails a commit that moves the mark to m.Last while cut says so.
func (d *database) cutShort(m event.Mark) error {
	if d.cut[m.Last] == 0 {
		return nil
	}
	d.cut[m.Last]--
	return event.Transient(fmt.Errorf("the connection was cut before the commit that moves the mark to %d", m.Last))
}

// letters are the event ids of the outbox's letters, in order.
func (d *database) letters() []string {
	out := make([]string, len(d.outbox))
	for i, l := range d.outbox {
		out[i] = l.EventID
	}
	return out
}

type modelLane struct{ db *database }

func (l modelLane) Apply(ctx context.Context, ev event.Event) (event.Result, error) {
	panic("the journal's lane applies through ApplyMarked")
}

func (l modelLane) Close() {}

func (l modelLane) Marked(context.Context, string) (int64, time.Time, error) {
	if l.db.down != nil {
		return 0, time.Time{}, l.db.down
	}
	return l.db.mark, l.db.at, nil
}

// Vouch vouches for the mark if the database holds it, and raises its
// time to when the read began.
func (l modelLane) Vouch(_ context.Context, _ string, mark int64, began time.Time) error {
	if l.db.down != nil {
		return l.db.down
	}
	if l.db.mark == mark {
		l.db.vouched = true
		l.db.vouches++
		if began.After(l.db.at) {
			l.db.at = began
		}
	}
	return nil
}

// Vouched says the database lost commits unless a vouch came after the
// last loss and no restore moved the mark since.
func (l modelLane) Vouched(context.Context, string) (int64, string, error) {
	if f := l.db.vouching; f != nil {
		l.db.vouching = nil
		f()
	}
	if l.db.down != nil {
		return 0, "", l.db.down
	}
	if !l.db.vouched {
		return l.db.mark, "it was last synced while the server ran from before, and the server has started again since", nil
	}
	return l.db.mark, "", nil
}

// unvouched is journal_advance's refusal of a mark no read vouched for
// since the last loss, unless the move is a restore's.
func (d *database) unvouched(m event.Mark) error {
	if m.Restore || d.vouched || d.mark != m.Prev {
		return nil
	}
	return event.Transient(fmt.Errorf("%w: holds %d, vouched for before a loss", event.ErrJournalGap, d.mark))
}

// ParkMarked parks lt in the database's outbox and moves the mark, as
// one commit: the mark's time stays on a restore's move, as
// journal_advance keeps it.
func (l modelLane) ParkMarked(_ context.Context, lt event.OutboxLetter, m event.Mark) error {
	d := l.db
	if f := d.before; f != nil {
		d.before = nil
		f()
	}
	if d.down != nil {
		return event.Transient(d.down)
	}
	if d.mark != m.Prev {
		return event.Transient(fmt.Errorf("%w: holds %d, went on from %d", event.ErrJournalGap, d.mark, m.Prev))
	}
	if err := d.unvouched(m); err != nil {
		return err
	}
	if d.outboxDown != nil {
		return event.Transient(d.outboxDown)
	}
	if err := d.cutShort(m); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.committed()
	d.outbox = append(d.outbox, lt)
	d.mark = m.Last
	if m.Restore {
		d.vouched = false
	} else {
		d.at = time.Now()
	}
	return nil
}

func (l modelLane) ApplyMarked(_ context.Context, evs []event.Event, m event.Mark) ([]event.Outcome, error) {
	d := l.db
	if f := d.before; f != nil {
		d.before = nil
		f()
	}
	if d.down != nil {
		return nil, event.Transient(d.down)
	}
	if d.mark != m.Prev {
		return nil, event.Transient(fmt.Errorf("%w: holds %d, went on from %d", event.ErrJournalGap, d.mark, m.Prev))
	}
	if err := d.unvouched(m); err != nil {
		return nil, err
	}
	outs := make([]event.Outcome, len(evs))
	for _, ev := range evs {
		if err := d.refuse[ev.ID]; err != nil {
			return nil, err
		}
	}
	if err := d.cutShort(m); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.committed()
	if len(evs) > 0 {
		d.txs++
	}
	if !m.Restore {
		d.at = time.Now()
	} else {
		d.vouched = false
	}
	for i, ev := range evs {
		switch {
		case d.conflic[ev.ID]:
			outs[i].Err = event.Conflict(errors.New("conflict"))
		case slices.Contains(d.applied, ev.ID):
			outs[i].Duplicate = true
		default:
			d.applied = append(d.applied, ev.ID)
		}
	}
	d.mark = m.Last
	return outs, nil
}

// stream is a model of the journal's stream: its entries in order, and
// the sequences its retention took.
type stream struct {
	entries []Entry
	written []time.Time // when each entry was written: a read from since takes none before it
	head    time.Time   // when its first entry was written
	reads   int
	page    int // entries per page; 2 when 0
	// stuck: a read does not answer; stuckFor is how long the last
	// one's context would have waited for it.
	stuck    bool
	stuckFor time.Duration
	// bad: the entries whose message no longer parses.
	bad map[int64]bool
	// raw: messages put in the stream as they are (put), which a read
	// hands over through the real takeDelivery, each before the entry
	// that was next when it was put.
	raw []rawMessage
	// blocked: a read cannot begin, its fence held by a broker alarm.
	blocked bool
	atPage  func() // runs before each page is handed over

	// The lane's appender writes from a goroutine of its own: the
	// failure to answer with and the writes refused go by mu.
	mu      sync.Mutex
	fail    error
	refused int
	// hang: a write waits for its context's end, as one the broker
	// holds during an alarm; land: it reaches the stream first, its
	// confirm never coming.
	hang, land bool
}

// hold has every write wait for its context (land: after it reached
// the stream), until let.
func (s *stream) hold(land bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hang, s.land = true, land
}

func (s *stream) let() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hang = false
}

// refuse has every write fail with err from now on (nil: none).
func (s *stream) refuse(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = err
}

func (s *stream) refusals() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused
}

// write takes msgs as the stream would, their entries read back from
// their bodies: the events of events() carry their id as the message id.
func (s *stream) write(ctx context.Context, queue string, msgs []event.Spilled) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		s.refused++
		return s.fail
	}
	if s.hang {
		s.refused++
		if s.land {
			if err := s.take(queue, msgs); err != nil {
				return err
			}
		}
		s.mu.Unlock()
		<-ctx.Done()
		s.mu.Lock()
		return ctx.Err()
	}
	return s.take(queue, msgs)
}

func (s *stream) take(queue string, msgs []event.Spilled) error {
	if s.head.IsZero() {
		s.head = time.Now()
	}
	for _, m := range msgs {
		var wire []wireEntry
		if err := json.Unmarshal(m.Body, &wire); err != nil {
			return err
		}
		for _, w := range wire {
			e := Entry{Queue: queue, Seq: w.Seq, Dead: w.Dead,
				Event: event.Event{ID: w.MessageID, Type: w.Type, Message: event.Message{MessageID: w.MessageID, Body: w.Body}}}
			if w.Letter != nil {
				e = w.entry(queue) // a letter's, as the real read takes it
			}
			s.entries = append(s.entries, e)
			s.written = append(s.written, time.Now())
		}
	}
	return nil
}

// rawMessage is a journal message put in the stream as it is.
type rawMessage struct {
	before  int // the index of the entry it comes before
	headers amqp.Table
	body    []byte
	written time.Time
}

// put appends to the stream a message of queue that holds its entries
// first … last, body as it is, as another process (another release) may
// have written it: a read hands it over as the Journal's read does, its
// offset in the stream counted in messages.
func (s *stream) put(queue string, first, last int64, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.head.IsZero() {
		s.head = time.Now()
	}
	h := amqp.Table{hQueue: queue, hFirst: first, hLast: last, "x-stream-offset": int64(len(s.entries) + len(s.raw))}
	s.raw = append(s.raw, rawMessage{before: len(s.entries), headers: h, body: body, written: time.Now()})
}

// readAll hands over pages of two entries, unless told otherwise, so that
// restores cross pages.
func (s *stream) readAll(ctx context.Context, since time.Time, reads map[string]*queueRead) error {
	s.reads++
	if s.blocked {
		return &unreadError{fmt.Errorf("journal: fence: %w", errBlocked)}
	}
	if s.stuck {
		// A stream that does not answer would hold the read as long as
		// its context lets it: that is what is said.
		d, _ := ctx.Deadline()
		s.stuckFor = time.Until(d)
		return errors.New("the stream does not answer")
	}
	size := cmp.Or(s.page, 2)
	page := func(qr *queueRead) {
		if s.atPage != nil {
			s.atPage()
		}
		qr.err = qr.page(qr.found)
		qr.found.Entries = nil
	}
	// The writer may write meanwhile (a restore does not wait for what
	// the database holds): the read sees what was written when it began.
	s.mu.Lock()
	head, entries, written, raw := s.head, slices.Clone(s.entries), slices.Clone(s.written), slices.Clone(s.raw)
	s.mu.Unlock()
	for _, qr := range reads {
		qr.found = Found{Highest: qr.after, FromStart: since.IsZero(), Head: head}
	}
	putBefore := func(i int) error {
		for ; len(raw) > 0 && raw[0].before == i; raw = raw[1:] {
			if raw[0].written.Before(since) {
				continue
			}
			if _, err := takeDelivery(reads, raw[0].headers, raw[0].body); err != nil {
				return err
			}
		}
		return nil
	}
	for i, e := range entries {
		if err := putBefore(i); err != nil {
			return err
		}
		qr := reads[e.Queue]
		if qr == nil || qr.err != nil || written[i].Before(since) {
			continue // the stream's clock is the database's here: no skew
		}
		if s.bad[e.Seq] {
			qr.unreadable(e.Seq, e.Seq, e.Seq, errors.New("no longer parses"))
			continue
		}
		qr.take(e)
		if len(qr.found.Entries) == size {
			page(qr)
		}
	}
	if err := putBefore(len(entries)); err != nil {
		return err
	}
	for _, qr := range reads {
		if qr.err == nil && len(qr.found.Entries) > 0 {
			page(qr)
		}
	}
	return nil
}

// trim drops the stream's first n entries, as its retention does.
func (s *stream) trim(n int) {
	s.entries, s.written = s.entries[n:], s.written[n:]
	s.head = time.Now()
}

func newLane(db *database, s *stream) *Lane {
	return newLaneWith(db, s, Config{})
}

// newLaneWith opens a lane over db and s with cfg; a model spill in cfg
// is db's, which it reads the mark of.
func newLaneWith(db *database, s *stream, cfg Config) *Lane {
	if k, ok := cfg.Spill.(*spill); ok && k.db == nil {
		k.db = db
	}
	return makeLane(s, cfg, "q.0", modelLane{db}, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

func events(n int) []event.Event {
	out := make([]event.Event, n)
	for i := range out {
		id := fmt.Sprintf("ev-%03d", i)
		out[i] = event.Event{ID: id, Type: "TransferCreated", Message: event.Message{MessageID: id, Body: []byte(`{}`)}}
	}
	return out
}

// ids are evs' event ids, in order.
func ids(evs []event.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.ID
	}
	return out
}

// applyBatch applies evs as the worker does, and waits, as its ack does,
// until their entries are confirmed.
func applyBatch(t *testing.T, l *Lane, evs []event.Event) ([]event.Outcome, error) {
	t.Helper()
	outs, err := l.ApplyBatch(t.Context(), evs)
	if err == nil {
		waitJournaled(t, l)
	}
	return outs, err
}

// waitJournaled waits until l's entries are confirmed, for a minute at most.
func waitJournaled(t *testing.T, l *Lane) {
	t.Helper()
	if c := l.Journaled(); c != nil {
		select {
		case <-c:
		case <-time.After(time.Minute):
			t.Fatal("the entries were not confirmed within a minute")
		}
	}
}

func applyAll(t *testing.T, l *Lane, evs []event.Event, batch int) {
	t.Helper()
	for i := 0; i < len(evs); i += batch {
		if _, err := applyBatch(t, l, evs[i:min(i+batch, len(evs))]); err != nil {
			t.Fatal(err)
		}
	}
}

// spill is a model of the database's journal_spill, in its lane's
// database (db): like Spill, it keeps a message only while the database's
// mark is at or past its last entry, and it notes after how many of the
// database's commits each was kept (at), which a loss of commits takes
// back with them (database.loseKept).
type spill struct {
	mu   sync.Mutex
	msgs []event.Spilled
	at   []int
	down error
	db   *database
}

func (k *spill) Spill(_ context.Context, _ string, msgs []event.Spilled) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.down != nil {
		return k.down
	}
	k.db.mu.Lock()
	mark, commits := k.db.mark, len(k.db.commits)
	k.db.mu.Unlock()
	if last := msgs[len(msgs)-1].Last; mark < last {
		return fmt.Errorf("the database does not hold the commits of entry %d: its mark is %d", last, mark)
	}
	for _, m := range msgs { // in the order of their sequences, each once, as the table's key keeps them
		i, kept := slices.BinarySearchFunc(k.msgs, m.First, func(o event.Spilled, first int64) int { return cmp.Compare(o.First, first) })
		if !kept {
			k.msgs, k.at = slices.Insert(k.msgs, i, m), slices.Insert(k.at, i, commits)
		}
	}
	return nil
}

func (k *spill) Spilled(_ context.Context, _ string, limit int) ([]event.Spilled, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.down != nil {
		return nil, k.down
	}
	return slices.Clone(k.msgs[:min(limit, len(k.msgs))]), nil
}

func (k *spill) Kept(context.Context, string) ([]event.KeptRun, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.down != nil {
		return nil, k.down
	}
	var runs []event.KeptRun
	for _, m := range k.msgs {
		if n := len(runs); n > 0 && m.First <= runs[n-1].Last+1 {
			runs[n-1].Last = max(runs[n-1].Last, m.Last)
			continue
		}
		runs = append(runs, event.KeptRun{First: m.First, Last: m.Last})
	}
	return runs, nil
}

func (k *spill) Mark(context.Context, string) (int64, error) {
	k.mu.Lock()
	down := k.down
	k.mu.Unlock()
	if down != nil {
		return 0, down
	}
	k.db.mu.Lock()
	defer k.db.mu.Unlock()
	return k.db.mark, nil
}

func (k *spill) Unspill(_ context.Context, _ string, last int64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.down != nil {
		return k.down
	}
	for i := 0; i < len(k.msgs); {
		if k.msgs[i].Last <= last {
			k.msgs, k.at = slices.Delete(k.msgs, i, i+1), slices.Delete(k.at, i, i+1)
			continue
		}
		i++
	}
	return nil
}

// kept counts the entries kept, down or not.
func (k *spill) kept() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := 0
	for _, m := range k.msgs {
		n += m.Entries
	}
	return n
}
