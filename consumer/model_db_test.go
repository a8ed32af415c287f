package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"transferconsumer/event"
)

// mdb is the database: the inbox, each account's balance and last applied
// event, and the dead-letter outbox (parked letters).
type mdb struct {
	t           fataler
	down        bool // every attempt fails: the environment (transient)
	unknown     bool // every attempt fails with an error nobody classified
	lostCommits bool // a COMMIT may succeed and its answer be lost
	bug         bool // a bug makes every attempt panic
	bugSeen     bool
	slowOver    int            // attempts of more events than this time out; 0: none do
	applied     map[string]int // the inbox: eventId -> applied
	effects     map[string]int // the message's effects, however its eventId was read
	balance     map[int]int64
	last        map[int]int // account -> seq of the last event applied
	panicked    map[string]bool
	byID        map[string]*mmsg
	msgs        []*mmsg // by seq
	parked      []*parkedLetter
	// mark is the journal's mark of the queue (journal_mark), and when it
	// last moved: with the journal, each commit moves it.
	mark   int64
	markAt time.Time
	r      func(n int) int
	logf   func(format string, args ...any)
}

// parkedLetter is a row of dead_letter_outbox a worker parked.
type parkedLetter struct {
	l   event.OutboxLetter
	gen int
	// held: the row is locked while the publish an alarm cut short is
	// unanswered (db.Inbox.holdParked): the drain passes over it.
	held bool
}

func newMDB() *mdb {
	return &mdb{applied: map[string]int{}, effects: map[string]int{}, balance: map[int]int64{}, last: map[int]int{},
		panicked: map[string]bool{}, byID: map[string]*mmsg{}}
}

// message is the message ev was decoded from, known by its transfer.
func (d *mdb) message(ev event.Event) *mmsg {
	seq, err := strconv.Atoi(ev.Transfer.ID[len(ev.Transfer.ID)-12:])
	if err != nil || seq >= len(d.msgs) {
		d.t.Fatalf("event %s: not one the model published", ev.ID)
	}
	return d.msgs[seq]
}

func (d *mdb) parkedFor(id string) bool {
	for _, p := range d.parked {
		if p.l.MessageID == id {
			return true
		}
	}
	return false
}

// apply applies evs in one transaction, which moves the journal's mark
// to m's (nil: none). It panics as the code under a bug would; the worker
// recovers.
func (d *mdb) apply(evs []event.Event, m *event.Mark) ([]event.Outcome, error) {
	switch {
	case d.down:
		return nil, event.Transient(errors.New("database down"))
	case d.slowOver > 0 && len(evs) > d.slowOver:
		return nil, event.Transient(errors.New("canceling statement due to statement timeout"))
	case d.unknown:
		return nil, errors.New("an error nobody classified")
	case d.bug:
		d.bugSeen = true
		panic("a bug that hits every message")
	}
	for _, ev := range evs {
		m := d.message(ev)
		switch {
		case m.kind == panicky || (m.kind == flaky && !d.panicked[m.id]):
			d.panicked[m.id] = true
			panic("boom")
		case m.kind == rejected:
			return nil, event.Rejected(errors.New("value out of range"))
		case m.kind == transition:
			return nil, event.Transition(errors.New("completed after failed"))
		}
	}
	outs := make([]event.Outcome, len(evs))
	for i, ev := range evs {
		m := d.message(ev)
		if m.kind == conflict {
			outs[i].Err = event.Conflict(errors.New("same eventId, other content"))
			continue
		}
		if d.applied[ev.ID] > 0 { // the inbox: keyed by the eventId
			outs[i].Duplicate = true
			continue
		}
		// A message a worker dead-lettered for the bug that panics on every
		// message (bugged) let its account's later events go on; should its
		// ack be lost, a delivery after the bug healed applies it after
		// them, as a replay of its letter would.
		if last, ok := d.last[m.account]; ok && last > m.seq && !m.bugged {
			d.t.Fatalf("account %d: event %d applied after event %d", m.account, m.seq, last)
		}
		d.applied[ev.ID]++
		d.effects[m.id]++
		account, _ := strconv.Atoi(strings.TrimPrefix(ev.Transfer.FromAccount, "acc_"))
		d.balance[account] += ev.Transfer.AmountMinor // the effect, as the event says
		d.last[m.account] = max(d.last[m.account], m.seq)
	}
	if m != nil {
		d.moveMark(*m)
	}
	if d.lostCommits && d.r(3) == 0 {
		d.logf("the answer to the COMMIT of %d events from %s is lost", len(evs), evs[0].ID)
		return nil, event.Transient(errors.New("connection reset by peer (after COMMIT)"))
	}
	return outs, nil
}

// mapp is the applier a replica's service runs with: its lanes, its
// parker and its outbox are the model database's.
type mapp struct {
	s  *sim
	rp *replica
}

func (a *mapp) Apply(ctx context.Context, ev event.Event) (event.Result, error) {
	outs, err := a.attempt(ctx, []event.Event{ev}, nil)
	if err != nil {
		return event.Result{}, err
	}
	return outs[0].Result, outs[0].Err
}

func (a *mapp) ApplyBatch(ctx context.Context, evs []event.Event) ([]event.Outcome, error) {
	return a.attempt(ctx, evs, nil)
}

// ApplyMarked is the journal's lane's transaction: evs applied, and the
// mark moved with them; with no events, the mark alone (a restore's).
func (a *mapp) ApplyMarked(ctx context.Context, evs []event.Event, m event.Mark) ([]event.Outcome, error) {
	if len(evs) == 0 {
		d := a.s.db
		if err := d.marking(m); err != nil {
			return nil, err
		}
		d.moveMark(m)
		return nil, nil
	}
	return a.attempt(ctx, evs, &m)
}

// Marked is the database's mark of the queue.
func (a *mapp) Marked(context.Context, string) (int64, time.Time, error) {
	if a.s.db.down {
		return 0, time.Time{}, event.Transient(errors.New("database down"))
	}
	return a.s.db.mark, a.s.db.markAt, nil
}

// marking is journal_advance's check: the database is up and holds the
// mark the move goes on from.
func (d *mdb) marking(m event.Mark) error {
	switch {
	case d.down:
		return event.Transient(errors.New("database down"))
	case d.mark != m.Prev:
		return event.Transient(fmt.Errorf("%w: holds %d, went on from %d", event.ErrJournalGap, d.mark, m.Prev))
	}
	return nil
}

func (d *mdb) moveMark(m event.Mark) {
	d.mark = m.Last
	if !m.Restore {
		d.markAt = time.Now()
	}
}

// attempt is one transaction, with the journal's mark m (nil: none). Now
// and then a SIGTERM arrives during it and outlasts SHUTDOWN_TIMEOUT: the
// statement is cancelled, nothing committed.
func (a *mapp) attempt(ctx context.Context, evs []event.Event, m *event.Mark) (outs []event.Outcome, err error) {
	s, rp := a.s, a.rp
	switch {
	case rp.gapRetry: // the journal's lane tries again at once, within the worker's one call
	case rp.ended:
		s.t.Fatalf("replica %d applies after its session ended", rp.id)
	case rp.waitApply:
		s.t.Fatalf("replica %d tries again without waiting after the environment failed", rp.id)
	}
	rp.gapRetry = false
	s.command(rp, "apply")
	if ctx.Err() == nil && !s.calm && s.r.IntN(60) == 0 {
		s.logf("r%d: SIGTERM during an attempt, which outlasts SHUTDOWN_TIMEOUT", rp.id)
		s.endSession(rp)
		rp.endWork(event.ErrShutdown)
	}
	if ctx.Err() != nil {
		s.logf("r%d: the attempt is cancelled", rp.id)
		return nil, errors.New("canceling statement due to statement timeout")
	}
	if m != nil && !s.db.down && s.db.mark != m.Prev {
		// Another consumer moved the mark, or a COMMIT whose answer was
		// lost did: the lane reads the journal and tries again at once.
		s.logf("r%d: the database holds mark %d, the lane went on from %d", rp.id, s.db.mark, m.Prev)
		rp.gapRetry = true
		return nil, s.db.marking(*m)
	}
	defer func() {
		p := recover()
		if p != nil {
			s.logf("r%d: applying %d events from %s panics: %v", rp.id, len(evs), evs[0].ID, p)
		}
		switch {
		case p != nil && len(evs) == 1: // a lone panic: held in place, or dead-lettered at the limit
			id := evs[0].ID
			rp.lonePanics[id]++
			if rp.lonePanics[id] > panicLimit && rp.blame {
				s.t.Fatalf("replica %d: event %s panicked alone %d times, and the queue applied something since its last panic's letter: "+
					"it must be dead-lettered, not held", rp.id, id, rp.lonePanics[id])
			}
			rp.waitApply = true
		case p != nil: // a batch that panics is split
		case err != nil:
			class := event.ClassOf(context.Background(), err)
			rp.waitApply = !event.CausedByMessage(class) && class != event.ClassShutdown
		default:
			for _, o := range outs {
				if o.Err == nil {
					rp.blame, rp.mayBug = true, true // something was applied
				}
			}
			if m != nil {
				ids := make([]string, len(evs))
				for i, ev := range evs {
					ids[i] = s.db.message(ev).id
				}
				rp.journaling(*m, ids...)
			}
		}
		if p != nil {
			panic(p)
		}
	}()
	outs, err = s.db.apply(evs, m)
	s.logf("r%d applies %d events from %s: %v", rp.id, len(evs), evs[0].ID, err)
	return outs, err
}

func (a *mapp) Lane(time.Duration) event.Lane { return a }
func (a *mapp) Close()                        {}

// Park keeps l in the outbox; it fails while the database is down.
func (a *mapp) Park(ctx context.Context, l event.OutboxLetter) error {
	return a.park(l, nil)
}

// ParkMarked is the journal's lane's parking: l kept in the outbox, and
// the mark moved over its entry, in one transaction.
func (a *mapp) ParkMarked(_ context.Context, l event.OutboxLetter, m event.Mark) error {
	return a.park(l, &m)
}

func (a *mapp) park(l event.OutboxLetter, m *event.Mark) error {
	a.s.letterCall(a.rp, "parks", l.Class)
	if a.s.db.down {
		a.rp.waitLetter = true
		return event.Transient(errors.New("database down"))
	}
	if l.Abandoned != nil && a.s.cutParkFails() {
		a.rp.waitLetter = true
		return event.Transient(errors.New("canceling statement due to statement timeout"))
	}
	if m != nil {
		if err := a.s.db.marking(*m); err != nil {
			a.s.logf("r%d: the database holds mark %d, the lane went on from %d", a.rp.id, a.s.db.mark, m.Prev)
			a.rp.gapRetry = true
			return err
		}
		a.s.db.moveMark(*m)
		a.rp.journaling(*m, l.MessageID)
	}
	a.s.logf("r%d parks the letter of %s (held: %v)", a.rp.id, l.EventID, l.Abandoned != nil)
	a.rp.alarmCopies = 0
	a.s.b.blame(a.s.db.byID[l.MessageID], l.Class, &a.rp.mayBug)
	p := &parkedLetter{l: l, gen: a.rp.gen, held: l.Abandoned != nil}
	a.s.db.parked = append(a.s.db.parked, p)
	return nil
}

// DrainOutbox hands the parked letters, oldest first, to publish, passing
// over those held; it stops at the first that fails.
func (a *mapp) DrainOutbox(ctx context.Context, publish func(event.OutboxLetter) error) (int, error) {
	d := a.s.db
	if d.down {
		return 0, event.Transient(errors.New("database down"))
	}
	n := 0
	var keep []*parkedLetter
	for i, p := range d.parked {
		if p.held {
			keep = append(keep, p)
			continue
		}
		if err := publish(p.l); err != nil {
			d.parked = append(keep, d.parked[i:]...)
			return n, err
		}
		n++
	}
	d.parked = keep
	return n, nil
}

// answered resolves the held rows whose publish got its answer: a confirm
// deletes the row, anything else releases it (db.Inbox.holdParked).
func (d *mdb) answered() {
	var keep []*parkedLetter
	for _, p := range d.parked {
		if p.held {
			select {
			case err := <-p.l.Abandoned:
				p.held = false
				if err == nil {
					d.logf("the parked letter of %s is dropped: its publish was confirmed", p.l.EventID)
					continue
				}
			default:
			}
		}
		keep = append(keep, p)
	}
	d.parked = keep
}

// release: the process of worker gen is gone, and with it the locks it held.
func (d *mdb) release(gen int) {
	for _, p := range d.parked {
		if p.gen == gen {
			p.held = false
		}
	}
}
