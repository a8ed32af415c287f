package consumer

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"transferconsumer/event"
)

// The real worker's loop (worker.run, with its core, core.go) against a
// model of a quorum queue and of the database, through random schedules:
// several replicas, BATCH_MAX from 1 to 50, and session ends, crashes,
// panics in applying and in decoding, alarms, consumer timeouts, database
// outages, failing acks, rejects and publishes, nacked and unanswered
// publishes, the park of a letter whose publish an alarm cut short failing
// (and the alarm passing meanwhile) in one such park in two, so that its
// answer decides (sim.cutParkFails), copies refused for good, a dead-letter
// connection that drops, unlisted producers and bodies at MAX_BODY_BYTES
// and one byte over, anywhere, also while a dead letter's copy awaits its
// confirm. The worker runs through its ports (ports.go): fakes whose
// behaviour the models decide, the loop stopped at each call and wherever
// it waits, so that deliveries, timers, cancels, channel closes and the
// session's end reach it in every order its select could see
// (model_ports_test.go). After every step the invariants hold:
//
//   - nothing is acked unless it was applied, or dead-lettered with its
//     copy confirmed or parked;
//   - with the journal, nothing is acked before the journal confirmed the
//     entries of the commit that applied it (model_journal_test.go);
//   - nothing is applied twice, and each account's balance is the sum of
//     the events applied to it, each once, even when a COMMIT's answer is
//     lost;
//   - each account's events are applied in publish order, but for a
//     message dead-lettered for the bug that panics on every message:
//     its later events go on, and should its ack be lost, a delivery
//     after the bug healed applies it after them, as a replay would;
//   - nothing reaches the DLQ that the message did not cause, but for one
//     letter per worker when a bug makes every message panic;
//   - at most one letter reaches the DLQ per delivery;
//   - a worker whose session ended applies nothing more and ends; one the
//     broker cancelled settles nothing more and closes its channel;
//   - a worker one of whose commands failed does nothing more on that
//     channel;
//   - a failure of the environment waits its backoff before the next
//     attempt;
//   - a message that panics alone panicLimit times is dead-lettered in
//     the same session when the queue applied something since its last
//     panic's letter;
//   - nothing is returned by requeue, least of all a message whose copy
//     was refused;
//   - at most one consumer holds messages of the queue;
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

// defaultDeliveryLimit is DELIVERY_LIMIT's default (config.go): the model
// runs with the limit the service is deployed with.
const defaultDeliveryLimit = 10

type kind int

const (
	valid         kind = iota
	poison             // undecodable: dead-lettered at once
	rejected           // the database refuses it, alone or in a batch (data-rejected)
	transition         // the database finds it contradicts its transfer (invalid-transition)
	conflict           // a producer conflict: that event's own outcome
	panicky            // its apply panics, every time
	flaky              // its apply panics once, then passes
	oversize           // its body is one byte over MAX_BODY_BYTES
	unlisted           // its producer is not on the allow-list
	decodePanicky      // decoding it panics, every time
)

func (k kind) String() string {
	return [...]string{"valid", "poison", "rejected", "transition", "conflict", "panicky", "flaky",
		"oversize", "unlisted", "decode-panicky"}[k]
}

func (k kind) causedByMessage() bool {
	return k != valid && k != flaky
}

type mmsg struct {
	seq     int
	id      string // the eventId, a UUID
	account int
	amount  int64
	kind    kind
	returns int  // counted returns: x-delivery-count
	bugged  bool // dead-lettered by a bug that panicked on every message (allowed once per worker)
}

// mconsumer is one consumer on one channel.
type mconsumer struct {
	rep       *replica
	prefetch  int
	nextTag   uint64
	held      map[uint64]*mmsg // delivered, unsettled
	keys      map[uint64]int   // the delivery of each tag (x-model-delivery)
	buffer    []uint64         // delivered, not yet taken by the worker
	cancelled bool             // by itself or by the broker: gets nothing new
	byBroker  bool             // the broker cancelled it (4.3's consumer timeout)
	forgotten bool             // 4.3: active again after a late ack, unknown to the client
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
	dlq       map[string]int // letters by event id
	perKey    map[int]int    // letters by delivery
	mayTwice  map[int]bool   // deliveries whose letter may be there twice (a publish cut short, then the process or session gone)
	deliveryN int
	rejecter  *replica // whose reject is being settled
	alarm     bool
	uncounted bool          // returns are not counted: an operator's restarts
	inflight  []*publishing // dead-letter publishes an alarm cut short, routed once it passes
	db        *mdb
	logf      func(format string, args ...any)
	moved     func()
}

// publishing is a dead letter's publish awaiting the broker.
type publishing struct {
	m      *mmsg
	key    int
	class  string
	gen    int
	answer chan error
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
		b.deliveryN++
		b.logf("broker delivers %d to r%d (tag %d, delivery %d)", m.seq, c.rep.id, c.nextTag, b.deliveryN)
		c.held[c.nextTag] = m
		c.keys[c.nextTag] = b.deliveryN
		if !c.forgotten {
			c.buffer = append(c.buffer, c.nextTag)
		}
		gave = true
	}
	b.holders()
	return gave
}

// holders checks that at most one consumer holds messages of the queue.
func (b *broker) holders() {
	n := 0
	for _, c := range b.consumers {
		if !c.closed && len(c.held) > 0 {
			n++
		}
	}
	if n > 1 {
		b.t.Fatalf("%d consumers hold messages of one queue (single active consumer broken)", n)
	}
}

// giveBack returns m to the head of the queue, behind what was returned
// before it, counting the return when counted; past the delivery limit the
// broker dead-letters it instead.
func (b *broker) giveBack(m *mmsg, counted bool) {
	if counted {
		m.returns++
		if m.returns > b.limit {
			b.letter(m, 0, "delivery_limit")
			return
		}
	}
	b.returns = append(b.returns, m)
}

// letter puts a letter of m in the DLQ: of delivery key (0: none, the
// broker's delivery limit), with class.
func (b *broker) letter(m *mmsg, key int, class string) {
	b.logf("DLQ gets a letter of %d (delivery %d, %s)", m.seq, key, class)
	b.moved()
	if !m.kind.causedByMessage() && !m.bugged {
		b.t.Fatalf("event %d (%v) dead-lettered (%s) though the message did not cause it", m.seq, m.kind, class)
	}
	b.dlq[m.id]++
	if key != 0 {
		b.perKey[key]++
		if n := b.perKey[key]; n > 2 || (n > 1 && !b.mayTwice[key]) {
			b.t.Fatalf("event %d: delivery %d left %d letters in the DLQ", m.seq, key, n)
		}
	}
}

// blame: a worker decided to dead-letter m as class. A bug that panics on
// every message may make it blame one of them, but no second one until it
// has applied something since (may: whether it still may).
func (b *broker) blame(m *mmsg, class string, may *bool) {
	if m.kind.causedByMessage() || m.bugged {
		return
	}
	if class != string(event.ClassPanic) || !b.db.bugSeen || !*may {
		b.t.Fatalf("event %d (%v) dead-lettered (%s) though the message did not cause it", m.seq, m.kind, class)
	}
	*may = false
	m.bugged = true
}

// route ends the alarm's hold on the dead-letter publishes it cut short:
// each is routed and confirmed, or nacked.
func (b *broker) route() {
	for _, p := range b.inflight {
		if b.r.IntN(4) == 0 {
			b.logf("the held letter of %d is nacked", p.m.seq)
			p.answer <- errors.New("broker nacked the message")
			continue
		}
		b.letter(p.m, p.key, p.class)
		p.answer <- nil
	}
	b.inflight = nil
	b.db.answered() // as the parker's hold learns it
}

// drop ends the publishes of worker gen still unanswered: its connection is
// gone. Each may or may not have been routed; the answer is a closed
// channel, and the letter parked instead may go out too.
func (b *broker) drop(gen int) {
	var keep []*publishing
	for _, p := range b.inflight {
		if p.gen != gen {
			keep = append(keep, p)
			continue
		}
		b.mayTwice[p.key] = true
		if b.r.IntN(2) == 0 {
			b.letter(p.m, p.key, p.class)
		}
		p.answer <- errors.New("channel closed")
	}
	b.inflight = keep
	b.db.answered()
}

// settle acks or returns tag (and with multiple everything below it).
func (b *broker) settle(c *mconsumer, tag uint64, multiple, ack bool, requeue, counted bool) error {
	if c.closed {
		return errors.New("channel closed")
	}
	if _, ok := c.held[tag]; !ok && c.byBroker && b.ver == v43 {
		// Returned by the timeout already: accepted, and it changes
		// nothing for the message; but the cancelled consumer becomes
		// the active one again when no other is, unknown to the client
		// (conformance_test.go, TestBrokerRuleConsumerTimeoutWithNoOtherConsumer).
		if c.cancelled && (b.active() == nil) {
			b.logf("r%d's late settle makes its cancelled consumer active again", c.rep.id)
			c.cancelled, c.forgotten = false, true
		}
		return nil
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
		b.moved()
		switch {
		case ack:
			if b.db.effects[m.id] == 0 && b.dlq[m.id] == 0 && !b.db.parkedFor(m.id) {
				b.t.Fatalf("event %d (%v) acked though neither applied nor dead-lettered", m.seq, m.kind)
			}
			if c.rep.unjournaledHolds(m) {
				b.t.Fatalf("event %d (%v) acked before the journal confirmed the entries of the commit that applied it", m.seq, m.kind)
			}
		case requeue:
			b.giveBack(m, counted)
		default: // the queue's own dead-lettering, for the class of the copy refused
			class := "rejected"
			if rp := b.rejecter; rp != nil && rp.nacked[c.keys[t]] != "" {
				class = rp.nacked[c.keys[t]]
			}
			b.letter(m, c.keys[t], class)
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
	b.returnHeld(c, !b.uncounted)
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
// accepted and does nothing (but see settle).
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
	c.cancelled, c.byBroker = true, true
	b.returnHeld(c, false)
	if !c.forgotten {
		c.rep.cancelNotice = true
	}
	return true
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
	return fmt.Sprintf("seed=%d version=%v messages=%d disruptions=%d replicas=%d batch_max=%d journal=%v late_journal=%v",
		sc.seed, sc.ver, sc.messages, sc.disruptions, sc.replicas, sc.batchMax, sc.journal(), sc.lateJournal())
}

// journal: one schedule in three applies through a journaledLane. It is
// told by the seed, so that the others draw what they drew before.
func (sc schedule) journal() bool { return sc.seed%3 == 1 }

// lateJournal: in one journal schedule in four, the journal confirms a
// replica's entries only once its session ended (model_journal_test.go).
func (sc schedule) lateJournal() bool { return sc.journal() && sc.seed/3%4 == 0 }

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
// The first broken invariant is the one reported. On a worker's goroutine
// it ends the goroutine (the worker's own recover cannot catch that), and
// the schedule fails once the worker has stopped (sim.wait).
type fatalT struct {
	msg      string
	trace    []string
	inWorker *bool
}
type fatalStop struct{}

func (f *fatalT) Fatalf(format string, args ...any) {
	if f.msg == "" {
		f.msg = fmt.Sprintf(format, args...)
	}
	if f.inWorker != nil && *f.inWorker {
		runtime.Goexit()
	}
	panic(fatalStop{})
}

func play(ft *fatalT, sc schedule) {
	r := rand.New(rand.NewPCG(sc.seed, 1))
	db := newMDB()
	b := &broker{ver: sc.ver, limit: defaultDeliveryLimit, dlq: map[string]int{}, perKey: map[int]int{},
		mayTwice: map[int]bool{}, db: db}
	b.r = r
	s := &sim{r: r, b: b, db: db, batchMax: sc.batchMax, linger: r.IntN(3) == 0, maxBody: 400 + r.IntN(200),
		stuck: map[string]bool{}, ft: ft, journal: sc.journal(), lateJournal: sc.lateJournal(), stream: mstream{moved: make(chan struct{}, 1)}}
	ft.inWorker = &s.inWorker
	fatal := func(format string, args ...any) {
		if ft.msg == "" {
			ft.trace = lines(s.trace)
		}
		ft.Fatalf(format, args...)
	}
	b.t = &tShim{fatal}
	b.logf = s.logf
	b.moved = func() { s.moved++ }
	db.t = &tShim{fatal}
	db.r, db.logf = r.IntN, s.logf
	s.t = &tShim{fatal}
	defer s.killAll()
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
		case x == 5:
			k = transition
		case x == 6:
			k = oversize
		case x == 7:
			k = unlisted
		case x == 8 && r.IntN(2) == 0:
			k = decodePanicky
		}
		m := &mmsg{seq: i, id: fmt.Sprintf("00000000-0000-4000-8000-%012d", i), account: r.IntN(4),
			amount: 1 + r.Int64N(100), kind: k}
		msgs = append(msgs, m)
		db.byID[m.id] = m
		db.msgs = append(db.msgs, m)
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
				if rp.running && rp.ended {
					fatal("replica %d: its session ended, but it waits instead of ending", rp.id)
				}
				if rp.running && rp.cancelSeen {
					fatal("replica %d: the broker cancelled its consumer, but it waits instead of closing", rp.id)
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
	db.down, db.unknown, db.lostCommits, db.bug, s.decodeBug = false, false, false, false, false
	if b.alarm {
		b.alarm = false
		b.route()
	}
	if r.IntN(2) == 0 {
		db.slowOver = 1 + r.IntN(4)
		s.logf("database slow over %d for good", db.slowOver)
	}
	s.logf("the environment heals")
	s.calm = true
	for _, rp := range s.reps {
		if !rp.running {
			s.logf("r%d: start", rp.id)
			s.start(rp)
		}
	}
	// A queue held by a panic that was not blamed on its message (the one
	// before it was) waits for an operator: each round that ends short of
	// done restarts every replica, as an operator would. So does a replica
	// whose worker ended (a cancel, a closed channel): the service
	// reconnects.
	settled := func() bool {
		for _, m := range msgs {
			if db.effects[m.id] == 0 && b.dlq[m.id] == 0 {
				return false
			}
		}
		return len(db.parked) == 0
	}
	for round := 0; ; round++ {
		// A round ends when nothing more happens, or when nothing has
		// moved for a while (a queue held by a panic only ticks).
		steps, moved, still := 0, s.moved, 0
		for steps < 5000 && still < 300 && s.progress() {
			steps++
			if still++; s.moved != moved {
				moved, still = s.moved, 0
			}
		}
		s.logf("round %d: %d steps", round, steps)
		for _, rp := range s.reps {
			if !rp.running { // the service reconnects
				s.logf("r%d: reconnects", rp.id)
				s.start(rp)
			}
		}
		if settled() && !s.progress() && len(b.main)+len(b.returns) == 0 {
			break
		}
		if round == 30 {
			fatal("no quiescence after the environment healed and %d restarts", round)
		}
		// The operator's restarts spend no delivery: each round returns
		// every message in hand, and enough rounds would otherwise take a
		// valid one past the delivery limit (an operator who restarts so
		// often raises the limit, or the prefetch is smaller).
		s.logf("an operator restarts every replica")
		for _, rp := range s.reps {
			if rp.running && !rp.ended {
				s.endSession(rp)
			}
		}
		b.uncounted = true
		for s.stepAll() {
		}
		b.uncounted = false
		for _, rp := range s.reps {
			if !rp.running {
				s.start(rp)
			}
		}
	}
	balance := map[int]int64{}
	for _, m := range msgs {
		switch {
		case m.bugged && db.effects[m.id] == 1:
			// The bug struck after a COMMIT whose answer was lost: the
			// event was applied, and its letter is a duplicate to replay.
			balance[m.account] += m.amount
		case m.kind.causedByMessage() || m.bugged:
			if db.effects[m.id] > 0 {
				fatal("event %d (%v) applied", m.seq, m.kind)
			}
			if b.dlq[m.id] == 0 {
				fatal("event %d (%v) neither applied nor dead-lettered", m.seq, m.kind)
			}
		case db.effects[m.id] != 1:
			fatal("event %d applied %d times", m.seq, db.effects[m.id])
		default:
			balance[m.account] += m.amount
		}
	}
	for a := 0; a < 4; a++ {
		if db.balance[a] != balance[a] {
			fatal("account %d: balance %d, want %d (the effects of its events, each once)", a, db.balance[a], balance[a])
		}
	}
	for _, c := range b.consumers {
		if !c.closed && len(c.held) > 0 {
			fatal("messages still held after quiescence")
		}
	}
}

type tShim struct{ fatal func(string, ...any) }

func (t *tShim) Fatalf(format string, args ...any) { t.fatal(format, args...) }

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
	n := defaultSchedules
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
		if msg, trace := run(sc); msg != "" {
			small := sc
			if !strings.Contains(msg, errBusyLoop) { // each run of a busy loop leaves it running
				small, msg, trace = shrink(sc)
			}
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
