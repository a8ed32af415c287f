package consumer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
	"transferconsumer/retry"
	"transferconsumer/topology"
)

// replica is one instance of the service consuming the queue: the real
// worker, with fake ports that the broker and database models answer.
type replica struct {
	id, gen      int
	w            *worker
	cons         *mconsumer
	endSession   context.CancelFunc
	endWork      context.CancelCauseFunc
	running      bool           // a session is up
	waiting      bool           // the worker waits for its timer
	channelGone  bool           // the broker closed the channel: the notice is on its way
	cancelNotice bool           // the broker cancelled the consumer: the notice is on its way
	cancelSeen   bool           // the worker was told of the cancel
	ended        bool           // its session was told to end
	sinceEnd     int            // commands carried out since
	alarmCopies  int            // copies tried in a row while an alarm blocks publishing
	nacked       map[int]string // class of each delivery whose letter was nacked
}

type sim struct {
	t        fataler
	r        *rand.Rand
	b        *broker
	db       *mdb
	reps     []*replica
	gens     int
	batchMax int
	linger   bool
	refusals int  // one copy in refusals is refused, about
	calm     bool // the environment has healed: nothing more goes wrong
	trace    []string
}

func (s *sim) logf(format string, args ...any) {
	s.trace = append(s.trace, fmt.Sprintf(format, args...))
}

// start starts rp's service: a session, its worker and its consumer.
func (s *sim) start(rp *replica) {
	s.gens++
	rp.gen = s.gens
	rp.running, rp.ended, rp.sinceEnd, rp.waiting = true, false, 0, false
	rp.channelGone, rp.cancelNotice, rp.cancelSeen, rp.alarmCopies = false, false, false, 0
	rp.nacked = map[int]string{}
	app := &mapp{s: s, rp: rp}
	cfg := Config{BatchMax: s.batchMax, Instance: "r" + strconv.Itoa(rp.gen), ApplyTimeout: time.Second,
		Retry: retry.Backoff{Min: time.Millisecond, Max: 8 * time.Millisecond}, Topology: topology.Spec{Prefix: "transfers"}}
	if s.linger {
		cfg.BatchLinger = time.Millisecond
	}
	cfg.Observe = func(d Decision) { // what the log and the metrics say of each delivery
		if d.EventID == "" || (d.Action == ActionAck) != (d.Class == "") {
			s.t.Fatalf("replica %d: decision %+v names no event, or an action its class contradicts", rp.id, d)
		}
	}
	svc := New(cfg, app)
	session, endSession := context.WithCancel(context.Background())
	work, endWork := context.WithCancelCause(context.Background())
	rp.endSession, rp.endWork = endSession, endWork
	rp.cons = &mconsumer{rep: rp, prefetch: max(1, s.batchMax), held: map[uint64]*mmsg{}, keys: map[uint64]int{}}
	s.b.consumers = append(s.b.consumers, rp.cons)
	rp.w = &worker{svc: svc, queue: "q", tag: cfg.Instance + "/q", session: session, work: work,
		ch: &mchannel{s: s, rp: rp}, letters: &mletters{s: s, rp: rp}, parker: app, now: time.Now,
		lane: app, core: newCore(cfg.BatchMax, cfg.BatchLinger > 0)}
}

// endSession ends rp's session, as SIGTERM or a failure elsewhere does.
func (s *sim) endSession(rp *replica) {
	if rp.ended {
		return
	}
	rp.ended, rp.waiting = true, false
	rp.endSession()
	rp.w.ended()
}

// stop: rp's process is gone or its session over: the broker closes what
// it held, its dead-letter connection's publishes are unanswered, and the
// database releases its locks.
func (s *sim) stop(rp *replica) {
	s.b.closeChannel(rp.cons)
	s.b.drop(rp.gen)
	s.db.release(rp.gen)
	rp.running = false
}

// step makes one move of rp: a notice from the broker, deliveries taken,
// or one command of its worker carried out.
func (s *sim) step(rp *replica) bool {
	if !rp.running {
		return false
	}
	switch {
	case rp.channelGone:
		rp.channelGone = false
		rp.w.channelClosed(&amqp.Error{Code: 406, Reason: "PRECONDITION_FAILED - delivery acknowledgement timed out"})
		return true
	case rp.cancelNotice && s.r.IntN(2) == 0: // the notice arrives when it does
		rp.cancelNotice, rp.cancelSeen = false, true
		rp.w.cancelled()
		return true
	}
	if s.r.IntN(2) == 0 && s.take(rp) {
		return true
	}
	_, state, ran := rp.w.step()
	if rp.ended && ran {
		if rp.sinceEnd++; rp.sinceEnd > 500 {
			s.t.Fatalf("replica %d does not end after its session ended", rp.id)
		}
	}
	switch {
	case ran:
		return true
	case state == stepDone:
		s.logf("r%d done", rp.id)
		s.stop(rp) // the session closes the connection
		return true
	case state == stepWait:
		rp.waiting = true // the timer is armed
		return true
	}
	return s.take(rp)
}

// take hands rp's worker what has arrived: some of it, or all.
func (s *sim) take(rp *replica) bool {
	c := rp.cons
	if len(c.buffer) > 0 {
		n := 1 + s.r.IntN(len(c.buffer))
		for _, tag := range c.buffer[:n] {
			m := c.held[tag]
			if m == nil {
				continue // returned by a consumer timeout (4.3) before the worker took it
			}
			s.logf("r%d takes %d (tag %d)", rp.id, m.seq, tag)
			rp.w.take(s.delivery(m, tag, c.keys[tag]))
		}
		c.buffer = c.buffer[n:]
		return true
	}
	return false
}

// delivery is the amqp091 delivery of m.
func (s *sim) delivery(m *mmsg, tag uint64, key int) amqp.Delivery {
	body := []byte("not JSON")
	if m.kind != poison {
		body = fmt.Appendf(nil, `{"eventId":%q,"eventType":"TransferCreated","occurredAt":"2026-07-10T12:00:00Z",`+
			`"data":{"transferId":"0c8a4c0e-2d37-4c61-8f0e-%012d","fromAccount":"acc_%05d","toAccount":"acc_99999",`+
			`"amountMinor":%d,"currency":"EUR"}}`, m.id, m.seq, m.account, m.amount)
	}
	return amqp.Delivery{DeliveryTag: tag, Body: body, MessageId: m.id, RoutingKey: "acc",
		Redelivered: m.returns > 0, Headers: amqp.Table{"x-delivery-count": int64(m.returns), "x-model-delivery": int64(key)}}
}

// mchannel is a replica's AMQP channel, on the broker model.
type mchannel struct {
	s  *sim
	rp *replica
}

func (c *mchannel) settled(what string, tag uint64) {
	c.s.logf("r%d %s tag %d", c.rp.id, what, tag)
	if c.rp.cancelSeen {
		c.s.t.Fatalf("replica %d: %s after the broker cancelled its consumer", c.rp.id, what)
	}
}

func (c *mchannel) Ack(tag uint64, multiple bool) error {
	c.settled(fmt.Sprintf("ack(multiple=%v)", multiple), tag)
	return c.s.b.settle(c.rp.cons, tag, multiple, true, false, true)
}

func (c *mchannel) Reject(tag uint64, requeue bool) error {
	c.settled(fmt.Sprintf("reject(requeue=%v)", requeue), tag)
	c.s.b.rejecter = c.rp
	return c.s.b.settle(c.rp.cons, tag, false, false, requeue, c.s.b.ver < v43)
}

// Cancel cancels the consumer: the broker may serve the next one at once.
func (c *mchannel) Cancel(string, bool) error {
	c.s.logf("r%d cancels its consumer", c.rp.id)
	c.rp.cons.cancelled = true
	if c.s.r.IntN(2) == 0 {
		c.s.b.deliver()
	}
	return nil
}

func (c *mchannel) Close() error {
	c.s.logf("r%d closes its channel", c.rp.id)
	c.s.b.closeChannel(c.rp.cons)
	return nil
}

func (c *mchannel) IsClosed() bool { return c.rp.cons.closed }

// mletters is a replica's dead-letter publisher, on the broker model.
type mletters struct {
	s  *sim
	rp *replica
}

func (l *mletters) alarmed() bool {
	if l.s.b.alarm {
		l.stall()
	}
	return l.s.b.alarm
}

// stall counts the copies a worker tries while an alarm blocks publishing
// and it could park the letter instead.
func (l *mletters) stall() {
	if l.s.db.down || l.rp.ended {
		return
	}
	if l.rp.alarmCopies++; l.rp.alarmCopies > 20 {
		l.s.t.Fatalf("replica %d: the events behind a dead letter wait for an alarm to pass", l.rp.id)
	}
}

// publish answers at once: the copy is confirmed, refused, or the wait for
// its confirm is cut by an alarm that starts or by the session's end.
func (l *mletters) publish(ctx context.Context, exchange, key string, msg amqp.Publishing) error {
	s, rp := l.s, l.rp
	if exchange != dlq.Exchange("transfers") {
		s.t.Fatalf("dead letter published to %q", exchange)
	}
	k, _ := msg.Headers["x-model-delivery"].(int64)
	class, _ := msg.Headers[dlq.HeaderClass].(string)
	m := s.db.byID[msg.MessageId]
	p := &publishing{m: m, key: int(k), class: class, gen: rp.gen, answer: make(chan error, 1)}
	s.b.blame(m, class, rp.gen)
	if s.b.alarm {
		l.stall()
		s.b.inflight = append(s.b.inflight, p) // held until the alarm passes
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.logf("r%d publishes the letter of %d while an alarm blocks: cut", rp.id, m.seq)
		return &alarmCut{answer: p.answer}
	}
	switch x := s.r.IntN(10); {
	case s.calm:
	case x == 0:
		s.logf("r%d: an alarm starts while the letter of %d awaits its confirm", rp.id, m.seq)
		s.b.alarm = true
		s.b.inflight = append(s.b.inflight, p)
		return &alarmCut{answer: p.answer}
	case x == 1:
		s.logf("r%d: its session ends while the letter of %d awaits its confirm", rp.id, m.seq)
		s.b.inflight = append(s.b.inflight, p)
		s.endSession(rp)
		if ctx.Err() == nil {
			s.t.Fatalf("replica %d: the session's end does not end the wait for a dead letter's confirm", rp.id)
		}
		return ctx.Err()
	}
	if s.r.IntN(s.refusals) == 0 {
		s.logf("r%d: the letter of %d is nacked", rp.id, m.seq)
		rp.nacked[p.key] = class // the reject that follows dead-letters it for that
		return errors.New("broker nacked the message")
	}
	rp.alarmCopies = 0
	s.b.letter(m, p.key, class)
	return nil
}

// drain is one run of a replica's outbox drain (drainLoop).
func (s *sim) drain(rp *replica) bool {
	s.db.answered()
	if len(s.db.parked) == 0 {
		return false
	}
	s.logf("r%d drains the outbox", rp.id)
	rp.w.svc.drainOutbox(context.Background(), "", func(exchange, key string, msg amqp.Publishing) error {
		if s.b.alarm {
			return errors.New("blocked by an alarm")
		}
		k, _ := msg.Headers["x-model-delivery"].(int64)
		class, _ := msg.Headers[dlq.HeaderClass].(string)
		s.b.letter(s.db.byID[msg.MessageId], int(k), class)
		return nil
	})
	return true
}

// progress makes one random step of delivery, work or drain; false when
// none is possible.
func (s *sim) progress() bool {
	s.b.holders()
	n := len(s.reps)
	for _, i := range s.r.Perm(2*n + 2) {
		switch {
		case i == 2*n:
			if s.b.deliver() {
				return true
			}
		case i == 2*n+1:
			for _, rp := range s.reps {
				if rp.running && rp.waiting {
					rp.waiting = false
					rp.w.tick()
					return true
				}
			}
		case i >= n:
			rp := s.reps[i-n]
			if rp.running && !rp.ended && !s.b.alarm && !s.db.down && s.drain(rp) {
				return true
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
	switch s.r.IntN(11) {
	case 0, 7: // SIGTERM, or the session ends for a failure elsewhere
		if rp.running && !rp.ended {
			s.logf("r%d: session ends", rp.id)
			s.endSession(rp)
		}
	case 1: // a crash: the broker returns what it held
		if rp.running {
			s.logf("r%d: crash", rp.id)
			s.stop(rp)
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
		if !s.b.alarm {
			s.b.route()
			for _, rp := range s.reps {
				rp.alarmCopies = 0
			}
		}
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
	case 8:
		s.db.unknown = !s.db.unknown
		s.logf("database fails unclassified=%v", s.db.unknown)
	case 9:
		s.db.lostCommits = !s.db.lostCommits
		s.logf("COMMIT answers lost=%v", s.db.lostCommits)
	case 10:
		s.db.bug = !s.db.bug
		s.logf("a bug panics on every message=%v", s.db.bug)
		if s.db.bug {
			clear(s.b.bugByGen) // each worker may dead-letter one message of this bug
		}
	}
}
