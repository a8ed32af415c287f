package consumer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
	"transferconsumer/event"
	"transferconsumer/journal"
	"transferconsumer/retry"
	"transferconsumer/topology"
)

// replica is one instance of the service consuming the queue: the real
// worker's loop (worker.run), with fake ports that the broker and database
// models answer. The loop runs on a goroutine of its own, but never at the
// same time as the schedule: it stops at each port it calls (before the
// call) and wherever it waits for what happens next, and goes on only when
// the schedule resumes it, with the loopEvent the schedule chose. So one
// seed is one interleaving, and the schedule can do anything the
// environment does between any two of the worker's calls.
type replica struct {
	id, gen      int
	w            *worker
	cons         *mconsumer
	endSession   context.CancelFunc
	endWork      context.CancelCauseFunc
	resume       chan resumption // the schedule resumes the worker
	yield        chan stop       // the worker stops
	at           stop            // where the worker stopped
	running      bool            // a session is up
	armed        bool            // the worker's timer is armed
	channelGone  bool            // the broker closed the channel: the notice is on its way
	cancelNotice bool            // the broker cancelled the consumer: the notice is on its way
	cancelSeen   bool            // the worker was told of the cancel
	ended        bool            // its session was told to end
	sinceEnd     int             // resumptions since
	alarmCopies  int             // copies tried in a row while an alarm blocks publishing
	nacked       map[int]string  // class of each delivery whose letter was refused
	// What the worker must not do next.
	failedCmd  string // a command of its failed, so the channel is gone: it does nothing more
	lastCall   string // the port it called last
	spinning   bool   // its worker never stopped: a busy loop
	waitApply  bool   // an attempt failed for the environment: the next waits its backoff
	waitLetter bool   // parking failed: the next copy or park waits its backoff
	// blame: no panic's letter was tried since something was applied, so
	// a lone panic that reaches the limit must be dead-lettered.
	blame      bool
	mayBug     bool           // a bug that panics on every message may cost one innocent's letter: nothing since applied
	lonePanics map[string]int // attempts of one event alone that panicked, by event id
	// With the journal: its lane (the journal's real one), the write its
	// writer waits on (jw), the entries the writer wrote and those the
	// lane committed, and its commits whose entries the stream has not
	// confirmed yet, oldest first (model_journal_test.go).
	lane            *journal.Lane
	jw              *mwrite
	received, added int
	unjournaled     []*mentries
	// gapRetry: the database did not hold the mark its lane went on from;
	// the lane reads the journal and tries again at once, within the
	// worker's one call (it is cleared once the worker waits again).
	gapRetry bool
	// journalStuck: SHUTDOWN_TIMEOUT passed while it waited for the
	// journal, which confirms nothing more until the environment heals.
	journalStuck bool
}

// stop is where a replica's worker stopped.
type stop struct {
	kind      stopKind
	call      string          // stopCall: the port about to be called
	ended     <-chan struct{} // stopNext: the session's end, when watched
	journaled <-chan struct{} // stopNext: the journal's confirm, when watched
}

type stopKind int

const (
	stopNext stopKind = iota // in loopPort.next, waiting for a loopEvent
	stopCall                 // about to call a port
	stopExit                 // run returned, or the goroutine was ended
)

// resumption is what the schedule resumes a worker with.
type resumption struct {
	h    loopEvent
	kill bool // the process is gone: the goroutine ends
}

type sim struct {
	t       fataler
	ft      *fatalT
	r       *rand.Rand
	b       *broker
	db      *mdb
	reps    []*replica
	gens    int
	journal bool // the replicas apply through the journal's lane
	stream  mstream
	jmu     sync.Mutex // the stream's, and each replica's jw and received
	// lateJournal: the journal confirms a replica's entries only once its
	// session ended (until the environment heals)
	lateJournal bool
	// flushStrikes: consumer timeouts struck while a worker waited for
	// the journal (timeoutWhileFlushing)
	flushStrikes int
	batchMax     int
	linger       bool
	maxBody      int
	refusals     int             // one copy in refusals is refused, about
	calm         bool            // the environment has healed: nothing more goes wrong
	inWorker     bool            // a worker runs: a broken invariant ends its goroutine
	decodeBug    bool            // a bug makes every decode panic
	stuck        map[string]bool // messages whose copies are always refused
	trace        []line
	moved        int // deliveries settled or dead-lettered, and events applied
	watchdog     *time.Timer
}

// busyLoop is how long a worker may run before it stops (at a port, or
// waiting): a step takes microseconds, so one that takes this long never
// ends.
const busyLoop = 20 * time.Second

// errBusyLoop is the invariant a worker in a busy loop breaks.
const errBusyLoop = "its worker runs on without calling a port or waiting for anything (a busy loop)"

// logf adds a line to the trace, formatted only should the schedule fail.
func (s *sim) logf(format string, args ...any) {
	s.trace = append(s.trace, line{format, args})
}

// line is one line of a schedule's trace, unformatted.
type line struct {
	format string
	args   []any
}

// lines formats a trace.
func lines(trace []line) []string {
	out := make([]string, len(trace))
	for i, l := range trace {
		out[i] = fmt.Sprintf(l.format, l.args...)
	}
	return out
}

// start starts rp's service: a session, its worker and its consumer, and
// runs the worker's loop until it first stops.
func (s *sim) start(rp *replica) {
	s.gens++
	rp.gen = s.gens
	rp.running, rp.ended, rp.sinceEnd, rp.armed = true, false, 0, false
	rp.channelGone, rp.cancelNotice, rp.cancelSeen, rp.alarmCopies = false, false, false, 0
	rp.failedCmd, rp.lastCall, rp.waitApply, rp.waitLetter, rp.blame, rp.mayBug = "", "", false, false, true, true
	rp.nacked, rp.lonePanics, rp.unjournaled, rp.journalStuck = map[int]string{}, map[string]int{}, nil, false
	app := &mapp{s: s, rp: rp}
	var lane event.Lane = app
	if s.journal {
		s.jmu.Lock()
		rp.jw, rp.received, rp.added = nil, 0, 0
		s.jmu.Unlock()
		rp.lane = s.openLane(rp, app)
		lane = rp.lane
	}
	producers, _ := NewProducers("producer", "")
	cfg := Config{BatchMax: s.batchMax, Instance: "r" + strconv.Itoa(rp.gen), ApplyTimeout: time.Second,
		Retry: retry.Backoff{Min: time.Millisecond, Max: 8 * time.Millisecond}, Topology: topology.Spec{Prefix: "transfers"},
		MaxBodyBytes: s.maxBody, Producers: producers}
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
	prefetch := prefetchFor(s.batchMax, lane) // the service's
	rp.cons = &mconsumer{rep: rp, prefetch: prefetch, held: map[uint64]*mmsg{}, keys: map[uint64]int{}}
	s.b.consumers = append(s.b.consumers, rp.cons)
	rp.w = &worker{svc: svc, queue: "q", tag: cfg.Instance + "/q", work: work,
		ch: &mchannel{s: s, rp: rp}, loop: &mloop{s: s, rp: rp}, letters: &mletters{s: s, rp: rp}, parker: app,
		decoder: s.decoder, now: time.Now, lane: lane, core: newCore(svc.coreConfig(lane, true))}
	rp.resume, rp.yield = make(chan resumption), make(chan stop)
	w, yield := rp.w, rp.yield
	s.inWorker = true
	go func() {
		defer func() {
			if p := recover(); p != nil {
				s.record(fmt.Sprintf("replica %d: the worker panicked: %v\n%s", rp.id, p, debug.Stack()))
			}
			yield <- stop{kind: stopExit}
		}()
		if err := w.run(session); err != nil {
			s.logf("r%d's worker returns: %v", rp.id, err)
		}
	}()
	s.wait(rp)
}

// record notes a broken invariant found on a worker's goroutine; the
// schedule fails with it once the worker stops.
func (s *sim) record(msg string) {
	if s.ft.msg == "" {
		s.ft.msg, s.ft.trace = msg, lines(s.trace)
	}
}

// wait waits for rp's worker, which runs (inWorker), to stop, and fails
// the schedule when the worker broke an invariant meanwhile, or when it
// does not stop: a worker that runs on without calling a port or waiting
// is in a busy loop (it is left running: the test fails anyway).
func (s *sim) wait(rp *replica) {
	if s.watchdog == nil {
		s.watchdog = time.NewTimer(busyLoop)
	} else {
		s.watchdog.Reset(busyLoop)
	}
	select {
	case rp.at = <-rp.yield:
		s.watchdog.Stop()
	case <-s.watchdog.C:
		rp.spinning = true
		s.record(fmt.Sprintf("replica %d: %s", rp.id, errBusyLoop))
	}
	s.inWorker = false
	if s.ft.msg != "" {
		panic(fatalStop{})
	}
	if rp.at.kind != stopExit {
		s.settleWriter(rp)
	}
}

// pause stops the worker at st until the schedule resumes it.
func (rp *replica) pause(st stop) loopEvent {
	if st.kind == stopNext {
		rp.gapRetry = false
	}
	rp.yield <- st
	r := <-rp.resume
	if r.kill {
		runtime.Goexit()
	}
	return r.h
}

// call stops the worker before it calls port; on the schedule's own
// goroutine (the outbox drain) it does not stop.
func (s *sim) call(rp *replica, port string) {
	if s.inWorker {
		rp.pause(stop{kind: stopCall, call: port})
	}
}

// endSession ends rp's session, as SIGTERM or a failure elsewhere does:
// the worker sees it when it looks.
func (s *sim) endSession(rp *replica) {
	if rp.ended {
		return
	}
	rp.ended, rp.sinceEnd = true, 0
	rp.endSession()
}

// kill ends rp's worker goroutine where it stopped: the process is gone.
func (s *sim) kill(rp *replica) {
	if rp.at.kind == stopExit || rp.yield == nil || rp.spinning {
		return
	}
	rp.resume <- resumption{kill: true}
	rp.at = <-rp.yield
}

// killAll ends every worker goroutine still running, when the schedule ends.
func (s *sim) killAll() {
	s.inWorker = false
	for _, rp := range s.reps {
		s.kill(rp)
		s.closeLane(rp)
	}
}

// stopReplica: rp's process is gone or its session over: the broker
// closes what it held, its dead-letter connection's publishes are
// unanswered, and the database releases its locks.
func (s *sim) stopReplica(rp *replica) {
	s.kill(rp)
	s.closeLane(rp)
	s.b.closeChannel(rp.cons)
	s.b.drop(rp.gen)
	s.db.release(rp.gen)
	rp.running = false
}

// ready returns what could happen next to rp's worker waiting in its
// loop, as its select would see it: each ready case once.
func (s *sim) ready(rp *replica) []loopEvent {
	c := rp.cons
	for len(c.buffer) > 0 && c.held[c.buffer[0]] == nil {
		c.buffer = c.buffer[1:] // returned by a consumer timeout (4.3) before the worker took it
	}
	var hs []loopEvent
	if len(c.buffer) > 0 {
		hs = append(hs, loopEvent{Kind: hDelivery}) // the next in the buffer, made once chosen
	}
	if rp.channelGone {
		reason := &amqp.Error{Code: 406, Reason: "PRECONDITION_FAILED - delivery acknowledgement timed out"}
		hs = append(hs, loopEvent{Kind: hChannelClosed, Reason: reason}, loopEvent{Kind: hNoDeliveries, Reason: reason},
			loopEvent{Kind: hNoDeliveries}) // the reason may not have come yet
	}
	if rp.cancelNotice {
		hs = append(hs, loopEvent{Kind: hNoDeliveries})
	}
	if rp.armed {
		hs = append(hs, loopEvent{Kind: hTimer})
	}
	if closed(rp.at.ended) { // the session's end, or, once told, the work's (SHUTDOWN_TIMEOUT)
		hs = append(hs, loopEvent{Kind: hEnded})
	}
	if closed(rp.at.journaled) {
		hs = append(hs, loopEvent{Kind: hJournaled})
	}
	return hs
}

// step makes one move of rp: resumes its worker from where it stopped,
// with one of the happenings its loop could see; false when none is ready.
func (s *sim) step(rp *replica) bool {
	if !rp.running {
		return false
	}
	var h loopEvent
	switch rp.at.kind {
	case stopCall:
		s.logf("r%d: %s", rp.id, rp.at.call)
	case stopExit:
		s.logf("r%d done", rp.id)
		s.stopReplica(rp) // the session closes the connection
		return true
	case stopNext:
		hs := s.ready(rp)
		if len(hs) == 0 {
			return false
		}
		h = hs[s.r.IntN(len(hs))]
		switch h.Kind {
		case hDelivery:
			c := rp.cons
			tag := c.buffer[0]
			c.buffer = c.buffer[1:]
			h.D = s.delivery(c.held[tag], tag, c.keys[tag])
			s.logf("r%d takes %d (tag %d)", rp.id, c.held[tag].seq, tag)
		case hChannelClosed, hNoDeliveries:
			if rp.channelGone {
				rp.channelGone = false
				s.logf("r%d is told its channel closed (%v, reason %v)", rp.id, h.Kind, h.Reason != nil)
			} else {
				rp.cancelNotice, rp.cancelSeen = false, true
				s.logf("r%d is told the broker cancelled its consumer", rp.id)
			}
		case hTimer:
			rp.armed, rp.waitApply, rp.waitLetter = false, false, false
			s.logf("r%d's timer is due", rp.id)
		case hEnded:
			s.logf("r%d is told its session ended", rp.id)
		}
	}
	if rp.ended {
		if rp.sinceEnd++; rp.sinceEnd > 500 {
			s.t.Fatalf("replica %d does not end after its session ended", rp.id)
		}
	}
	s.inWorker = true
	rp.resume <- resumption{h: h}
	s.wait(rp)
	return true
}

// mloop is a replica's loopPort: the schedule chooses what happens.
type mloop struct {
	s  *sim
	rp *replica
}

func (l *mloop) arm(time.Duration) { l.rp.armed = true }
func (l *mloop) stop()             { l.rp.armed = false }

func (l *mloop) next(ended, journaled <-chan struct{}) loopEvent {
	return l.rp.pause(stop{kind: stopNext, ended: ended, journaled: journaled})
}

// arrived hands the worker, now and then, the next delivery the broker
// pushed: it may or may not have reached the client yet.
func (l *mloop) arrived() (amqp.Delivery, bool) {
	c := l.rp.cons
	for len(c.buffer) > 0 && c.held[c.buffer[0]] == nil {
		c.buffer = c.buffer[1:]
	}
	if len(c.buffer) == 0 || l.s.r.IntN(4) == 0 {
		return amqp.Delivery{}, false
	}
	tag := c.buffer[0]
	c.buffer = c.buffer[1:]
	l.s.logf("r%d gathers %d (tag %d)", l.rp.id, c.held[tag].seq, tag)
	return l.s.delivery(c.held[tag], tag, c.keys[tag]), true
}

// delivery is the amqp091 delivery of m. An oversize message's body is
// one byte over MAX_BODY_BYTES, and every other valid message's exactly
// that long: the limit is tried at its boundary.
func (s *sim) delivery(m *mmsg, tag uint64, key int) amqp.Delivery {
	body := []byte("not JSON")
	if m.kind != poison {
		body = fmt.Appendf(nil, `{"eventId":%q,"eventType":"TransferCreated","occurredAt":"2026-07-10T12:00:00Z",`+
			`"data":{"transferId":"0c8a4c0e-2d37-4c61-8f0e-%012d","fromAccount":"acc_%05d","toAccount":"acc_99999",`+
			`"amountMinor":%d,"currency":"EUR"}`, m.id, m.seq, m.account, m.amount)
		size := len(body) + 1
		if m.kind == oversize {
			size = s.maxBody + 1
		} else if m.seq%2 == 0 {
			size = s.maxBody
		}
		if pad := size - len(body) - len(`,"pad":""}`); pad >= 0 {
			body = append(append(append(body, `,"pad":"`...), bytes.Repeat([]byte("x"), pad)...), '"')
		}
		body = append(body, '}')
	}
	user := "producer"
	if m.kind == unlisted {
		user = "intruder"
	}
	return amqp.Delivery{DeliveryTag: tag, Body: body, MessageId: m.id, RoutingKey: "acc", UserId: user,
		Redelivered: m.returns > 0, Headers: amqp.Table{"x-delivery-count": int64(m.returns), "x-model-delivery": int64(key)}}
}

// decoder is the workers' decoder: event.Decode, but for the messages a
// bug in decoding makes it panic on.
func (s *sim) decoder(body []byte, messageID, typ string) (event.Event, error) {
	if m := s.db.byID[messageID]; m != nil && (m.kind == decodePanicky || s.decodeBug) {
		if s.decodeBug {
			s.db.bugSeen = true
		}
		panic("a bug in decoding")
	}
	return event.Decode(body, messageID, typ)
}

// mchannel is a replica's AMQP channel, on the broker model.
type mchannel struct {
	s  *sim
	rp *replica
}

// command checks what a worker may do before it calls a port, stops it
// there, and logs the call.
func (s *sim) command(rp *replica, what string) {
	if rp.failedCmd != "" {
		s.t.Fatalf("replica %d: %s after its %s failed (the channel is gone)", rp.id, what, rp.failedCmd)
	}
	rp.lastCall = what
	s.call(rp, what)
}

func (c *mchannel) settle(what string, tag uint64, do func() error) error {
	s, rp := c.s, c.rp
	s.command(rp, what)
	s.logf("r%d %s tag %d", rp.id, what, tag)
	if rp.cancelSeen {
		s.t.Fatalf("replica %d: %s after the broker cancelled its consumer", rp.id, what)
	}
	if !s.calm && s.r.IntN(25) == 0 { // the connection drops under the command
		done := s.r.IntN(2) == 0
		if done {
			_ = do()
		}
		s.logf("r%d's channel is lost under its %s (done first: %v)", rp.id, what, done)
		s.b.closeChannel(rp.cons)
		rp.channelGone = true
		rp.failedCmd = what
		return amqp.ErrClosed
	}
	err := do()
	if err != nil {
		rp.failedCmd = what
	}
	return err
}

func (c *mchannel) Ack(tag uint64, multiple bool) error {
	return c.settle(fmt.Sprintf("ack(multiple=%v)", multiple), tag, func() error {
		return c.s.b.settle(c.rp.cons, tag, multiple, true, false, true)
	})
}

func (c *mchannel) Reject(tag uint64, requeue bool) error {
	return c.settle(fmt.Sprintf("reject(requeue=%v)", requeue), tag, func() error {
		if requeue {
			if class := c.rp.nacked[c.rp.cons.keys[tag]]; class != "" {
				c.s.t.Fatalf("replica %d: tag %d returned by requeue while its copy is refused (%s)", c.rp.id, tag, class)
			}
			c.s.t.Fatalf("replica %d: tag %d returned by requeue: only a close returns messages, in order", c.rp.id, tag)
		}
		c.s.b.rejecter = c.rp
		return c.s.b.settle(c.rp.cons, tag, false, false, false, false)
	})
}

// Cancel cancels the consumer: the broker may serve the next one at once.
// The worker never calls it (a mutant does: testdata/mutants).
func (c *mchannel) Cancel(string, bool) error {
	c.s.command(c.rp, "cancel")
	c.s.logf("r%d cancels its consumer", c.rp.id)
	c.rp.cons.cancelled = true
	if c.s.r.IntN(2) == 0 {
		c.s.b.deliver()
	}
	return nil
}

func (c *mchannel) Close() error {
	c.s.command(c.rp, "close")
	c.s.logf("r%d closes its channel", c.rp.id)
	c.s.b.closeChannel(c.rp.cons)
	return nil
}

func (c *mchannel) IsClosed() bool { return c.rp.cons.closed }

// lookForAlarm is the port call that begins a copy: the letters' alarmed.
const lookForAlarm = "looks for an alarm"

// mletters is a replica's dead-letter publisher, on the broker model.
type mletters struct {
	s  *sim
	rp *replica
}

func (l *mletters) alarmed() bool {
	if l.rp.ended {
		l.s.t.Fatalf("replica %d: copies a dead letter after its session ended", l.rp.id)
	}
	l.s.command(l.rp, lookForAlarm)
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

// letterCall checks what a worker may do before it copies or parks a
// dead letter of class, and stops it there.
func (s *sim) letterCall(rp *replica, what, class string) {
	switch {
	case rp.gapRetry: // the journal's lane parks again at once, within the worker's one call
	case rp.ended && rp.lastCall != lookForAlarm: // else the copy was decided before the session ended
		s.t.Fatalf("replica %d: %s a dead letter after its session ended", rp.id, what)
	case rp.waitLetter:
		s.t.Fatalf("replica %d: %s a dead letter again without waiting after parking failed", rp.id, what)
	}
	rp.gapRetry = false
	rp.waitApply = false // a letter came first: the failed attempt was the message's
	if class == string(event.ClassPanic) {
		rp.blame = false
	}
	s.command(rp, what)
}

// publish answers at once: the copy is confirmed, refused, or the wait for
// its confirm is cut by an alarm that starts or by the session's end.
func (l *mletters) publish(ctx context.Context, exchange, key string, msg amqp.Publishing, force bool) error {
	s, rp := l.s, l.rp
	class, _ := msg.Headers[dlq.HeaderClass].(string)
	s.letterCall(rp, "publishes", class)
	if exchange != dlq.Exchange("transfers") {
		s.t.Fatalf("dead letter published to %q", exchange)
	}
	if force {
		s.t.Fatalf("replica %d: a copy forced through an alarm though the letter could be parked", rp.id)
	}
	k, _ := msg.Headers["x-model-delivery"].(int64)
	m := s.db.byID[msg.MessageId]
	p := &publishing{m: m, key: int(k), class: class, gen: rp.gen, answer: make(chan error, 1)}
	s.b.blame(m, class, &rp.mayBug)
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
	if s.stuck[m.id] || s.r.IntN(s.refusals) == 0 {
		if !s.stuck[m.id] && s.r.IntN(2) == 0 {
			s.stuck[m.id] = true // its copies are refused from now on
		}
		rp.nacked[p.key] = class // the reject that follows dead-letters it for that
		if s.r.IntN(2) == 0 {
			s.logf("r%d: the letter of %d is nacked", rp.id, m.seq)
			return errors.New("broker nacked the message")
		}
		s.logf("r%d: the dead-letter channel closes under the letter of %d", rp.id, m.seq)
		return dlq.ErrChannelClosed
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
	moves := 2*n + 1
	if s.journal {
		moves += n // the journal confirms a replica's entries
		s.timeoutWhileFlushing()
	}
	for _, i := range s.r.Perm(moves) {
		switch {
		case i > 2*n:
			if s.confirm(s.reps[i-2*n-1]) {
				return true
			}
		case i == 2*n:
			if s.b.deliver() {
				return true
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
	return s.journal && s.shutdownTimeout()
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

// alarmEnds: the broker's alarm passes, and the publishes it cut short
// are answered.
func (s *sim) alarmEnds() {
	s.b.alarm = false
	s.logf("alarm=%v", s.b.alarm)
	s.b.route()
	for _, rp := range s.reps {
		rp.alarmCopies = 0
	}
}

// cutParkFails: the database fails the park of a letter whose publish an
// alarm cut short, in one such park in two, and the alarm passes
// meanwhile in one such failure in two. The letter's next copy then
// looks for the publish's answer, and only the answer says whether it
// went out (factAnswered): a nack, one answer in four, must have it
// published again. Left to chance (an outage that starts between the cut
// and the park, an alarm that ends before the copy that follows), the
// path came in about one schedule in 3,000, and a core that took any
// answer as a confirm survived runs of the model.
func (s *sim) cutParkFails() bool {
	if s.calm || s.r.IntN(2) == 0 {
		return false
	}
	s.logf("the database fails the park of a letter held for a cut publish")
	if s.b.alarm && s.r.IntN(2) == 0 {
		s.alarmEnds()
	}
	return true
}

// disrupt does one thing that the environment or an operator does.
func (s *sim) disrupt() {
	rp := s.reps[s.r.IntN(len(s.reps))]
	switch s.r.IntN(13) {
	case 0, 7: // SIGTERM, or the session ends for a failure elsewhere
		if rp.running && !rp.ended {
			s.logf("r%d: session ends", rp.id)
			s.endSession(rp)
		}
	case 1: // a crash: the broker returns what it held
		if rp.running {
			s.logf("r%d: crash", rp.id)
			s.stopReplica(rp)
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
		if s.b.alarm {
			s.alarmEnds()
		} else {
			s.b.alarm = true
			s.logf("alarm=%v", s.b.alarm)
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
	case 11:
		s.decodeBug = !s.decodeBug
		s.logf("a bug panics on every decode=%v", s.decodeBug)
	case 12: // the dead-letter connection drops on its own
		if rp.running {
			s.logf("r%d's dead-letter connection drops", rp.id)
			s.b.drop(rp.gen)
		}
	}
}
