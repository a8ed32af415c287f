package consumer

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
)

// The core (core.go) against a model of a quorum queue and of the
// database, through random schedules: several replicas, BATCH_MAX from 1 to
// 50, and session ends, crashes, panics, alarms, consumer timeouts and
// database outages anywhere. After every step the invariants hold:
//
//   - nothing is acked unless it was applied, or dead-lettered with its
//     copy confirmed;
//   - nothing is applied twice;
//   - each account's events are applied in publish order;
//   - nothing reaches the DLQ that the message did not cause;
//   - a worker whose session ended applies nothing more and ends.
//
// and once the environment heals, every event is applied or
// dead-lettered. Each rule of the broker model is a claim about RabbitMQ,
// pinned against the real versions by integration/conformance_test.go.
//
// A failing schedule is shrunk to fewer messages and disruptions and
// printed with its seed; MODEL_SEED=<seed> reruns one, MODEL_SCHEDULES sets
// how many run.

type version int

const (
	v310 version = iota // 3.x: every return counts toward the delivery limit
	v40                 // 4.0–4.2: as 3.x
	v43                 // 4.3+: Nack(requeue) does not count; a consumer timeout is a basic.cancel
)

func (v version) String() string { return [...]string{"3.10", "4.0", "4.3"}[v] }

type kind int

const (
	valid    kind = iota
	poison        // undecodable: dead-lettered at once
	rejected      // the database refuses it, alone or in a batch
	conflict      // a producer conflict: that event's own outcome
	panicky       // its apply panics, every time: the delivery limit ends it
	flaky         // its apply panics once, then passes
)

func (k kind) String() string {
	return [...]string{"valid", "poison", "rejected", "conflict", "panicky", "flaky"}[k]
}

func (k kind) causedByMessage() bool {
	return k == poison || k == rejected || k == conflict || k == panicky
}

type mmsg struct {
	seq     int
	id      string
	account int
	kind    kind
	returns int // counted returns: x-delivery-count
}

// mconsumer is one consumer on one channel.
type mconsumer struct {
	rep       *replica
	prefetch  int
	nextTag   uint64
	held      map[uint64]*mmsg // delivered, unsettled
	buffer    []uint64         // delivered, not yet taken by the worker
	cancelled bool             // by itself or by the broker: gets nothing new
	closed    bool
}

// fataler ends a schedule with a broken invariant.
type fataler interface {
	Fatalf(format string, args ...any)
}

type broker struct {
	t         fataler
	ver       version
	limit     int
	returns   []*mmsg // come back first, in the order returned
	main      []*mmsg
	consumers []*mconsumer // in the order they came
	current   *mconsumer   // the single active consumer
	r         *rand.Rand
	dlq       map[string]int
	alarm     bool
	db        *mdb
	logf      func(format string, args ...any)
}

// active returns the single active consumer. It stays active until it is
// cancelled or its channel closes; then the next is chosen among those
// waiting: arbitrarily on 3.x, by priority on 4.x (all equal here, so the
// first that came).
func (b *broker) active() *mconsumer {
	if c := b.current; c != nil && !c.cancelled && !c.closed {
		return c
	}
	var waiting []*mconsumer
	for _, c := range b.consumers {
		if !c.cancelled && !c.closed {
			waiting = append(waiting, c)
		}
	}
	b.current = nil
	if len(waiting) > 0 {
		b.current = waiting[0]
		if b.ver == v310 {
			b.current = waiting[b.r.IntN(len(waiting))]
		}
	}
	return b.current
}

// deliver gives the active consumer the queue's next messages, as many
// as its credit allows, at once (one step of the queue's state machine).
func (b *broker) deliver() bool {
	c := b.active()
	if c == nil {
		return false
	}
	gave := false
	for len(c.held) < c.prefetch {
		var m *mmsg
		switch {
		case len(b.returns) > 0:
			m, b.returns = b.returns[0], b.returns[1:]
		case len(b.main) > 0:
			m, b.main = b.main[0], b.main[1:]
		default:
			return gave
		}
		c.nextTag++
		b.logf("broker delivers %d to r%d (tag %d)", m.seq, c.rep.id, c.nextTag)
		c.held[c.nextTag] = m
		c.buffer = append(c.buffer, c.nextTag)
		gave = true
	}
	return gave
}

// giveBack returns m to the head of the queue, behind what was returned
// before it, counting the return when counted; past the delivery limit the
// broker dead-letters it instead.
func (b *broker) giveBack(m *mmsg, counted bool) {
	if counted {
		m.returns++
		if m.returns > b.limit {
			b.deadLetter(m, "delivery_limit")
			return
		}
	}
	b.returns = append(b.returns, m)
}

func (b *broker) deadLetter(m *mmsg, why string) {
	if !m.kind.causedByMessage() {
		b.t.Fatalf("event %d (%v) dead-lettered (%s) though the message did not cause it", m.seq, m.kind, why)
	}
	b.dlq[m.id]++
}

// settle acks or returns tag (and with multiple everything below it).
func (b *broker) settle(c *mconsumer, tag uint64, multiple, ack bool, requeue, counted bool) error {
	if c.closed {
		return errors.New("channel closed")
	}
	if _, ok := c.held[tag]; !ok && c.cancelled && b.ver == v43 {
		return nil // returned by the timeout already: accepted, and nothing happens
	}
	if _, ok := c.held[tag]; !ok {
		// An unknown delivery tag: the broker closes the channel (406).
		b.closeChannel(c)
		return errors.New("PRECONDITION_FAILED - unknown delivery tag")
	}
	tags := []uint64{tag}
	if multiple {
		tags = tags[:0]
		for t := range c.held {
			if t <= tag {
				tags = append(tags, t)
			}
		}
		sortTags(tags)
	}
	for _, t := range tags {
		m := c.held[t]
		delete(c.held, t)
		switch {
		case ack:
			if b.db.applied[m.id] == 0 && b.dlq[m.id] == 0 {
				b.t.Fatalf("event %d (%v) acked though neither applied nor dead-lettered", m.seq, m.kind)
			}
		case requeue:
			b.giveBack(m, counted)
		default:
			b.deadLetter(m, "rejected")
		}
	}
	return nil
}

func sortTags(tags []uint64) {
	for i := 1; i < len(tags); i++ {
		for j := i; j > 0 && tags[j] < tags[j-1]; j-- {
			tags[j], tags[j-1] = tags[j-1], tags[j]
		}
	}
}

// closeChannel returns everything the consumer holds, in delivery order,
// each return counted, before the next consumer gets anything.
func (b *broker) closeChannel(c *mconsumer) {
	if c.closed {
		return
	}
	c.closed = true
	b.returnHeld(c, true)
	c.buffer = nil
}

// returnHeld gives back everything c holds, in delivery order.
func (b *broker) returnHeld(c *mconsumer, counted bool) {
	tags := make([]uint64, 0, len(c.held))
	for t := range c.held {
		tags = append(tags, t)
	}
	sortTags(tags)
	for _, t := range tags {
		b.giveBack(c.held[t], counted)
	}
	c.held = map[uint64]*mmsg{}
}

// timeout is the consumer timeout of the active consumer, holding something:
// up to 4.2 the channel is closed, and the returns count; from 4.3 the
// consumer is cancelled and what it held is returned at once, uncounted,
// while the channel stays open, and a late ack of one of those tags is
// accepted and does nothing.
func (b *broker) timeout() bool {
	c := b.active()
	if c == nil || len(c.held) == 0 {
		return false
	}
	if b.ver < v43 {
		b.closeChannel(c)
		c.rep.channelGone = true
		return true
	}
	c.cancelled = true
	b.returnHeld(c, false)
	c.rep.cancelNotice = true
	return true
}

// mdb is the database: the inbox and each account's applied events.
type mdb struct {
	t        fataler
	down     bool
	slowOver int // attempts of more events than this time out; 0: none do
	applied  map[string]int
	last     map[int]int // account -> seq of the last event applied
	panicked map[string]bool
	byID     map[string]*mmsg
}

func (d *mdb) apply(evs []Event) ([]Outcome, error, Class) {
	if d.down {
		return nil, Transient(errors.New("database down")), ClassTransient
	}
	if d.slowOver > 0 && len(evs) > d.slowOver {
		return nil, Transient(errors.New("canceling statement due to statement timeout")), ClassTransient
	}
	for _, ev := range evs {
		m := d.byID[ev.ID]
		if m.kind == panicky || (m.kind == flaky && !d.panicked[m.id]) {
			d.panicked[m.id] = true
			return nil, &classified{class: ClassPanic, err: errors.New("panic: boom")}, ClassPanic
		}
		if m.kind == rejected {
			return nil, Rejected(errors.New("value out of range")), ClassRejected
		}
	}
	outs := make([]Outcome, len(evs))
	for i, ev := range evs {
		m := d.byID[ev.ID]
		if m.kind == conflict {
			outs[i].Err = Conflict(errors.New("same eventId, other content"))
			continue
		}
		if d.applied[m.id] > 0 {
			outs[i].Duplicate = true
			continue
		}
		if last, ok := d.last[m.account]; ok && last > m.seq {
			d.t.Fatalf("account %d: event %d applied after event %d", m.account, m.seq, last)
		}
		d.applied[m.id]++
		d.last[m.account] = m.seq
	}
	return outs, nil, ""
}

// replica is one instance of the service, consuming the queue: the core
// and a model of its worker.
type replica struct {
	id           int
	core         *core
	cons         *mconsumer
	running      bool // a session is up
	stopped      bool // shut down for good (until restarted)
	waiting      bool // the core waits for a tick
	copying      *slot
	stalled      int  // steps it could not make because a copy waits for an alarm
	channelGone  bool // the broker closed the channel
	cancelNotice bool // the broker cancelled the consumer
	ended        bool // its session was told to end
	sinceEnd     int  // commands carried out since
}

type sim struct {
	t        fataler
	r        *rand.Rand
	b        *broker
	db       *mdb
	reps     []*replica
	batchMax int
	linger   bool
	refusals int // one copy in refusals is refused, about
	trace    []string
}

func (s *sim) logf(format string, args ...any) {
	s.trace = append(s.trace, fmt.Sprintf(format, args...))
}

func (s *sim) start(rp *replica) {
	rp.core = newCore(s.batchMax, s.linger)
	rp.running, rp.stopped, rp.ended, rp.sinceEnd = true, false, false, 0
	rp.waiting, rp.copying, rp.channelGone, rp.cancelNotice = false, nil, false, false
	s.consume(rp, rp.core.max)
}

func (s *sim) consume(rp *replica, prefetch int) {
	rp.cons = &mconsumer{rep: rp, prefetch: prefetch, held: map[uint64]*mmsg{}}
	s.b.consumers = append(s.b.consumers, rp.cons)
}

// step carries out one action of rp's worker, if it has one.
func (s *sim) step(rp *replica) bool {
	if !rp.running {
		return false
	}
	if rp.channelGone {
		rp.channelGone = false
		rp.core.channelClosed()
	} else if rp.cancelNotice && s.r.IntN(2) == 0 { // the notice arrives when it does
		rp.cancelNotice = false
		rp.core.cancelled()
	}
	if rp.copying != nil {
		if s.b.alarm && !s.db.down && !rp.ended && !rp.core.closedErr {
			defer func() {
				if rp.copying == nil {
					rp.stalled = 0
				} else if rp.stalled++; rp.stalled > 20 {
					s.t.Fatalf("replica %d: the events behind a dead letter wait for an alarm to pass", rp.id)
				}
			}()
		}
		switch {
		case rp.ended || rp.core.closedErr:
			rp.core.copied(copyCut, errors.New("session ended"))
		case s.b.alarm:
			s.park(rp) // the alarm cut the wait for the confirm
		default:
			s.b.deadLetter(s.db.byID[rp.copying.Event.ID], "copied")
			rp.core.copied(copied, nil)
		}
		rp.copying = nil
		return true
	}
	cmd := rp.core.next()
	if rp.ended {
		rp.sinceEnd++
		if cmd.Kind == cmdApply {
			s.t.Fatalf("replica %d applies after its session ended", rp.id)
		}
		if rp.sinceEnd > 500 {
			s.t.Fatalf("replica %d does not end after its session ended", rp.id)
		}
	}
	c := rp.cons
	switch cmd.Kind {
	case cmdDone:
		s.logf("r%d done", rp.id)
		s.b.closeChannel(c) // the session closes the connection
		rp.running = false
		return true
	case cmdNone:
		if rp.waiting {
			return false
		}
		if len(c.buffer) == 0 {
			return false
		}
		// The worker takes what has arrived: some of it, or all.
		n := 1 + s.r.IntN(len(c.buffer))
		for _, tag := range c.buffer[:n] {
			m := c.held[tag]
			if m == nil {
				continue // returned by a consumer timeout (4.3) before the worker took it
			}
			sl := &slot{Tag: tag, Event: Event{ID: m.id}}
			if m.kind == poison {
				sl.Err = Poison(errors.New("not JSON"))
				sl.Class = ClassPoison
			}
			s.logf("r%d takes %d (tag %d)", rp.id, m.seq, tag)
			rp.core.deliver(sl)
		}
		c.buffer = c.buffer[n:]
		return true
	case cmdWait:
		rp.waiting = true
		return true
	case cmdApply:
		evs := make([]Event, len(cmd.Slots))
		for i, sl := range cmd.Slots {
			evs[i] = sl.Event
		}
		outs, err, class := s.db.apply(evs)
		s.logf("r%d applies %d events from %s: %v", rp.id, len(evs), evs[0].ID, err)
		rp.core.applied(outs, err, class)
	case cmdCopy:
		rp.copying = cmd.Slots[0]
		switch {
		case s.b.alarm: // the worker parks it at once
			s.park(rp)
			rp.copying = nil
		case s.r.IntN(s.refusals) == 0:
			rp.core.copied(copyRefused, errors.New("nacked"))
			rp.copying = nil
		}
	case cmdAck, cmdReject:
		ack := cmd.Kind == cmdAck
		tag := cmd.Tag
		if !ack {
			tag = cmd.Slots[0].Tag
		}
		s.logf("r%d %v tag %d multiple=%v", rp.id, cmd.Kind, tag, cmd.Multiple)
		if err := s.b.settle(c, tag, cmd.Multiple, ack, false, true); err != nil {
			rp.core.channelClosed()
		}
	case cmdClose:
		s.logf("r%d closes its channel", rp.id)
		s.b.closeChannel(c)
	}
	return true
}

// park parks the letter being copied in the database, where the outbox
// drain publishes it; it fails while the database is down.
func (s *sim) park(rp *replica) {
	if s.db.down {
		rp.core.copied(copyFailed, errors.New("database down"))
		return
	}
	s.logf("r%d parks the letter of %s", rp.id, rp.copying.Event.ID)
	s.b.deadLetter(s.db.byID[rp.copying.Event.ID], "parked")
	rp.core.copied(copied, nil)
}

// schedule is one random run's shape.
type schedule struct {
	seed        uint64
	ver         version
	messages    int
	disruptions int
	replicas    int
	batchMax    int
}

func (sc schedule) String() string {
	return fmt.Sprintf("seed=%d version=%v messages=%d disruptions=%d replicas=%d batch_max=%d",
		sc.seed, sc.ver, sc.messages, sc.disruptions, sc.replicas, sc.batchMax)
}

func newSchedule(seed uint64) schedule {
	r := rand.New(rand.NewPCG(seed, 0))
	bm := []int{1, 1, 2, 3, 5, 8, 50}[r.IntN(7)]
	return schedule{seed: seed, ver: version(r.IntN(3)), messages: 10 + r.IntN(60),
		disruptions: r.IntN(8), replicas: 1 + r.IntN(3), batchMax: bm}
}

// run plays sc and reports the first broken invariant, with the trace.
func run(sc schedule) (failure string, trace []string) {
	ft := &fatalT{}
	func() {
		defer func() {
			if p := recover(); p != nil {
				if _, ok := p.(fatalStop); !ok {
					ft.msg = fmt.Sprintf("panic: %v", p)
				}
			}
		}()
		play(ft, sc)
	}()
	return ft.msg, ft.trace
}

// fatalT stands in for testing.T in play, so a schedule can be shrunk.
type fatalT struct {
	msg   string
	trace []string
}
type fatalStop struct{}

func (f *fatalT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(fatalStop{})
}

func play(ft *fatalT, sc schedule) {
	r := rand.New(rand.NewPCG(sc.seed, 1))
	db := &mdb{applied: map[string]int{}, last: map[int]int{}, panicked: map[string]bool{}, byID: map[string]*mmsg{}}
	b := &broker{ver: sc.ver, limit: 30, dlq: map[string]int{}, db: db}
	b.r = r
	s := &sim{r: r, b: b, db: db, batchMax: sc.batchMax, linger: r.IntN(3) == 0}
	fatal := func(format string, args ...any) { ft.trace = s.trace; ft.Fatalf(format, args...) }
	b.t = &tShim{fatal}
	b.logf = s.logf
	db.t = &tShim{fatal}
	s.t = &tShim{fatal}
	var msgs []*mmsg
	dirt := []int{40, 40, 10}[r.IntN(3)] // one message in dirt is not valid, about
	s.refusals = []int{20, 4}[r.IntN(2)]
	for i := 0; i < sc.messages; i++ {
		k := valid
		switch x := r.IntN(dirt); {
		case x == 0:
			k = poison
		case x == 1:
			k = rejected
		case x == 2:
			k = conflict
		case x == 3 && r.IntN(2) == 0:
			k = panicky
		case x == 4:
			k = flaky
		}
		m := &mmsg{seq: i, id: "e" + strconv.Itoa(i), account: r.IntN(4), kind: k}
		msgs = append(msgs, m)
		db.byID[m.id] = m
		b.main = append(b.main, m)
	}
	for i := 0; i < sc.replicas; i++ {
		rp := &replica{id: i}
		s.reps = append(s.reps, rp)
		s.start(rp)
	}
	disruptions := sc.disruptions
	for steps := 0; steps < 20000; steps++ {
		if disruptions > 0 && r.IntN(40) == 0 {
			disruptions--
			s.disrupt()
			continue
		}
		if !s.progress() {
			for _, rp := range s.reps {
				if rp.copying != nil && s.b.alarm && !s.db.down && rp.running && !rp.ended {
					fatal("replica %d: the queue waits for an alarm to pass behind a dead letter's copy", rp.id)
				}
				if rp.running && rp.ended {
					fatal("replica %d: its session ended, but it waits instead of ending", rp.id)
				}
			}
			if disruptions == 0 {
				break
			}
			disruptions--
			s.disrupt()
		}
	}
	// The environment heals: every replica that is down starts again. A
	// database that is slow for large batches may stay so: they must
	// shrink until they pass.
	db.down, b.alarm = false, false
	if r.IntN(2) == 0 {
		db.slowOver = 1 + r.IntN(4)
		s.logf("database slow over %d for good", db.slowOver)
	}
	s.logf("the environment heals")
	for _, rp := range s.reps {
		if !rp.running {
			s.logf("r%d: start", rp.id)
			s.start(rp)
		}
	}
	// A queue held by a panic that was not blamed on its message (the one
	// before it was) waits for an operator: each round that ends short of
	// done restarts every replica, as an operator would.
	settled := func() bool {
		for _, m := range msgs {
			if db.applied[m.id] == 0 && b.dlq[m.id] == 0 {
				return false
			}
		}
		return true
	}
	for round := 0; ; round++ {
		for steps := 0; steps < 5000 && s.progress(); steps++ {
		}
		if settled() && !s.progress() {
			break
		}
		if round == 30 {
			fatal("no quiescence after the environment healed and %d restarts", round)
		}
		s.logf("an operator restarts every replica")
		for _, rp := range s.reps {
			if rp.running && !rp.ended {
				rp.ended, rp.waiting = true, false
				rp.core.end()
			}
		}
		for s.stepAll() {
		}
		for _, rp := range s.reps {
			if !rp.running {
				s.start(rp)
			}
		}
	}
	for _, m := range msgs {
		switch {
		case m.kind.causedByMessage():
			if db.applied[m.id] > 0 {
				fatal("event %d (%v) applied", m.seq, m.kind)
			}
			if b.dlq[m.id] == 0 {
				fatal("event %d (%v) neither applied nor dead-lettered", m.seq, m.kind)
			}
		case db.applied[m.id] != 1:
			fatal("event %d applied %d times", m.seq, db.applied[m.id])
		}
	}
	for _, c := range b.consumers {
		if !c.closed && len(c.held) > 0 {
			fatal("messages still held after quiescence")
		}
	}
	if len(b.main)+len(b.returns) > 0 {
		fatal("%d messages still queued after quiescence", len(b.main)+len(b.returns))
	}
}

type tShim struct{ fatal func(string, ...any) }

func (t *tShim) Fatalf(format string, args ...any) { t.fatal(format, args...) }

// progress makes one random step of delivery or work; false when none is
// possible. A dead letter's copy may wait for the broker, but never for
// long while an alarm blocks publishing and the database could keep the
// letter: the events behind it must not wait for the alarm to pass.
func (s *sim) progress() bool {

	order := s.r.Perm(len(s.reps) + 2)
	for _, i := range order {
		switch {
		case i == len(s.reps):
			if s.b.deliver() {
				return true
			}
		case i == len(s.reps)+1:
			for _, rp := range s.reps {
				if rp.running && rp.waiting {
					rp.waiting = false
					rp.core.tick()
					return true
				}
			}
		default:
			if s.step(s.reps[i]) {
				return true
			}
		}
	}
	return false
}

// stepAll steps every replica once; false when none could.
func (s *sim) stepAll() bool {
	any := false
	for _, rp := range s.reps {
		if s.step(rp) {
			any = true
		}
	}
	return any
}

// disrupt does one thing that the environment or an operator does.
func (s *sim) disrupt() {
	rp := s.reps[s.r.IntN(len(s.reps))]
	switch s.r.IntN(8) {
	case 0: // SIGTERM: the session ends
		if rp.running && !rp.ended {
			s.logf("r%d: SIGTERM", rp.id)
			rp.ended, rp.waiting = true, false
			rp.core.end()
		}
	case 1: // a crash: the broker returns what it held
		if rp.running {
			s.logf("r%d: crash", rp.id)
			s.b.closeChannel(rp.cons)
			rp.running = false
		}
	case 2: // a replica (re)starts
		if !rp.running {
			s.logf("r%d: start", rp.id)
			s.start(rp)
		}
	case 3:
		s.db.down = !s.db.down
		s.logf("database down=%v", s.db.down)
	case 4:
		s.b.alarm = !s.b.alarm
		s.logf("alarm=%v", s.b.alarm)
	case 5:
		if s.b.timeout() {
			s.logf("consumer timeout")
		}
	case 6:
		if s.db.slowOver == 0 {
			s.db.slowOver = 1 + s.r.IntN(4)
		} else {
			s.db.slowOver = 0
		}
		s.logf("database slow over %d", s.db.slowOver)
	case 7: // the session ends for a failure elsewhere (another queue)
		if rp.running && !rp.ended {
			s.logf("r%d: session ends", rp.id)
			rp.ended, rp.waiting = true, false
			rp.core.end()
		}
	}
}

// shrink looks for a smaller schedule that fails too.
func shrink(sc schedule) (schedule, string, []string) {
	msg, trace := run(sc)
	for changed := true; changed; {
		changed = false
		for _, try := range []schedule{
			{sc.seed, sc.ver, sc.messages / 2, sc.disruptions, sc.replicas, sc.batchMax},
			{sc.seed, sc.ver, sc.messages - 1, sc.disruptions, sc.replicas, sc.batchMax},
			{sc.seed, sc.ver, sc.messages, sc.disruptions - 1, sc.replicas, sc.batchMax},
			{sc.seed, sc.ver, sc.messages, sc.disruptions, sc.replicas - 1, sc.batchMax},
		} {
			if try.messages < 1 || try.disruptions < 0 || try.replicas < 1 {
				continue
			}
			if m, tr := run(try); m != "" {
				sc, msg, trace, changed = try, m, tr, true
				break
			}
		}
	}
	return sc, msg, trace
}

func TestCoreAgainstABrokerModel(t *testing.T) {
	n := 3000
	if testing.Short() {
		n = 300
	}
	if v, err := strconv.Atoi(os.Getenv("MODEL_SCHEDULES")); err == nil {
		n = v
	}
	seeds := make([]uint64, n)
	base := rand.Uint64()
	for i := range seeds {
		seeds[i] = base + uint64(i)
	}
	if v, err := strconv.ParseUint(os.Getenv("MODEL_SEED"), 10, 64); err == nil {
		seeds = []uint64{v}
	}
	for i, seed := range seeds {
		sc := newSchedule(seed)
		if msg, _ := run(sc); msg != "" {
			small, msg, trace := shrink(sc)
			if f := os.Getenv("MODEL_TRACE"); f != "" {
				_ = os.WriteFile(f, []byte(strings.Join(trace, "\n")+"\n"), 0o644)
			}
			if len(trace) > 400 {
				trace = append(trace[:100:100], append([]string{"…"}, trace[len(trace)-300:]...)...)
			}
			t.Fatalf("schedule %d of %d broke an invariant: %s\nrerun: MODEL_SEED=%d go test ./consumer -run TestCoreAgainstABrokerModel\nsmallest failing: %v\n%s",
				i+1, len(seeds), msg, seed, small, strings.Join(trace, "\n"))
		}
	}
	t.Logf("%d schedules passed", len(seeds))
}
