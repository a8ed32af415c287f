package consumer

import (
	"errors"
	"fmt"

	"transferconsumer/event"
)

// The decisions about one queue's deliveries, as a plain value without I/O
// (see adr/0002 and adr/0006), the way etcd's raft keeps its state machine:
// facts in, commands out, and the caller does the I/O. The worker
// (worker.go) feeds it what happened (a delivery arrived, and what the
// shell knows of it: its size, whether its producer is on the allow-list,
// its decoded event; an attempt to apply returned, and why the session had
// ended by then, for the core to classify its error; what became of a dead
// letter's copy or of its parking, or whether the publish an alarm cut
// short has been answered; the journal ticket what an apply or a park
// committed waits for, and that the journal holds a ticket; a wait ended;
// the session ended; the shutdown timeout passed; the broker cancelled the
// consumer; the channel closed; the channel failed a command) and carries
// out the one command it returns at a time: apply these events, copy this
// one to the DLQ (or look for its cut publish's answer), park it, wait (for
// a timer, and for the journal ticket it names), ack, reject, close the
// channel. A command that settles deliveries carries, for each, the
// decision (action, class, error) the worker logs and observes; a wait
// carries why the queue is blocked, and the class of that failure. The
// worker reads nothing else of it, and decides nothing about a delivery:
// not when a settlement goes, nor a failure's class, nor what an answer to
// a cut publish or a failed command means. model_test.go drives the real
// worker around it through thousands of random schedules against a model of
// the broker, the database and the journal.
//
// The rules it keeps:
//   - A delivery whose producer is not on the allow-list is dead-lettered
//     undecoded, and so is one whose body is over MAX_BODY_BYTES; any
//     other is decoded, and one that does not decode is dead-lettered.
//   - A producer conflict is the outcome of its event alone, even when the
//     event was applied alone.
//   - A delivery is acked only once it is final: applied (or a duplicate)
//     in a committed transaction, or dead-lettered with its copy confirmed
//     or parked. A multiple ack names a final delivery and covers only
//     final ones: the rejects of the refused go out before it. A refused
//     copy is rejected without requeue, never returned by requeue: the
//     queue's own dead-lettering takes it.
//   - With the journal, a delivery is settled only once the journal holds
//     the ticket of every apply or park that may have committed it (a
//     failed attempt's too), and settlements go in order, from the first
//     in hand: none passes one that waits (core_when.go). The next events
//     are applied meanwhile.
//   - Nothing behind a delivery that goes back to the queue is applied or
//     settled: it all goes back with it, in order, by closing the channel.
//     A cancel would hand the queue to the next single active consumer
//     while the held messages are still out, and they would come back
//     behind what it took meanwhile.
//   - Once the session ends, nothing new is applied: what is final is
//     settled, as the journal holds it, until the shutdown timeout passes;
//     the rest goes back by closing the channel, and so do the
//     settlements still waiting for the journal once it has passed.
//   - A consumer the broker cancelled settles nothing more, not even what
//     waits for the journal: on 4.3 a late ack would make it the queue's
//     active consumer again, unknown to the client, beside the next one.
//     Everything goes back by the close.
//   - A channel that failed a command is closed (the broker closes it, or
//     it was lost under it): nothing more is done on it; what was in hand,
//     the settlements waiting for the journal included, goes back with it.
//   - A dead letter is copied (published and confirmed) once. While a
//     broker alarm blocks publishing, or when it cuts the wait for the
//     confirm, the letter is parked in the database instead, when the
//     applier can park (else the copy waits for the alarm to pass); a
//     publish the alarm cut short counts as confirmed only on its confirm,
//     and while it is unanswered the letter is parked held back; a copy
//     the broker refused is rejected without requeue (the queue
//     dead-letters it); a session that ends first returns the message; a
//     failure to park is the environment's: waited out, then tried again.
//   - An attempt of several events that fails because of one of them (or
//     panics) is split: its first half is tried, until the event that
//     fails stands alone and takes the blame alone. One that the
//     environment fails is retried in place, after a backoff, with half as
//     many events; success doubles the size again.
//   - A panic is retried in place, like a failure nobody classified. After
//     panicLimit panics of one event alone it is dead-lettered as the
//     message's own fault, but only when the queue applied something
//     since its last such dead letter: a bug that hits every message
//     dead-letters at most one, then holds the queue, visibly. A panic
//     while decoding is dead-lettered at once on the same terms, and held
//     in place, for as long as it takes, when they do not hold. Any
//     panic's letter spends the blame, whether copied, parked or refused,
//     and waits for the deliveries pending before it: one of them may
//     take the blame first. Nothing behind it is applied until it is
//     settled: a panic may not come again, and a letter held, or returned
//     before its copy, is applied the next time.
//   - A failure of the environment always waits its backoff before the
//     next attempt.
//   - The core never returns a message by itself with Nack or Reject: only
//     a close returns a consumer's messages together, in order.

// nextStep is what becomes of a delivery in hand.
type nextStep int

const (
	nextPending  nextStep = iota // to apply
	nextApplying                 // in the attempt under way
	nextAck                      // applied or a duplicate: ack it
	nextLetter                   // its own fault: copy it to the DLQ (or park it), then ack it
	nextCopied                   // its dead-letter copy is confirmed or parked: ack it
	nextRefused                  // its copy was refused: reject it without requeue (the queue dead-letters it)
	nextReturn                   // back to the queue, in order, with everything behind it
)

// panicLimit is how many times one event alone may panic before it is
// dead-lettered (see core).
const panicLimit = 3

// final reports whether f needs nothing more than its settlement.
func (f nextStep) final() bool { return f == nextAck || f == nextCopied || f == nextRefused }

// inHand is one delivery in hand: what the core knows of it. The worker
// keeps the delivery itself, its span and its start by Tag.
type inHand struct {
	Tag   uint64
	Event event.Event // decoded, unless Err says why it could not be
	Next  nextStep
	Class event.Class // why it is not simply applied ("" when it was)
	Err   error
	// Duplicate and Outbox are what applying it did.
	Duplicate, Outbox bool
	Retries           int  // failed attempts of the environment it was part of
	Panics            int  // attempts of it alone that panicked
	Park              bool // nextLetter: park it in the database rather than copy it
	// Cut (nextLetter): an alarm cut the wait for its copy's confirm
	// short; the publish is answered later, and until then it is not
	// published again (a letter parked meanwhile is held back for it).
	Cut bool
	// Ticket: the journal ticket its settlement waits for (core.journaling);
	// 0 when it waits for none.
	Ticket uint64
	// Facts the shell gives with the delivery, before it is decoded: the
	// body's size, and why its producer may not move money (nil: it may).
	Size    int
	Refused error
}

// coreConfig is what a core is told once.
type coreConfig struct {
	Max     int  // the most events in one transaction: BATCH_MAX, or 1 when the applier has no batches
	Linger  bool // wait BATCH_LINGER for more before applying fewer than Max
	MaxBody int  // MAX_BODY_BYTES: a larger body is poison, undecoded; 0: no limit
	CanPark bool // the applier can park a dead letter while an alarm blocks publishing
}

// core decides what happens to the deliveries of one queue's consumer.
type core struct {
	max     int  // the most events in one transaction
	linger  bool // wait BATCH_LINGER for more before applying fewer than max
	maxBody int
	canPark bool
	// blame: a panic may be blamed on its message; false from a panic's
	// dead letter until something is applied again.
	blame bool

	hand    []*inHand // in hand, in delivery order
	busy    cmdKind   // cmdApply, cmdCopy, cmdPark or cmdWait under way; else cmdNone
	copying *inHand   // the dead letter of the cmdCopy or cmdPark under way

	size     int   // the most events the next attempt takes
	suspects int   // pending deliveries, from the first, known to hold one that fails alone
	failures int   // consecutive failures of the environment
	backoff  bool  // a wait is due before the next attempt
	lastErr  error // the environment's last failure, while failures > 0
	lingered bool  // the linger of the batch being gathered has passed

	ending           bool // the session ended or the broker cancelled the consumer
	cancelled        bool // the broker cancelled the consumer: nothing more is settled
	shutdownTimedOut bool // nothing more waits for the journal
	done             bool
	channelGone      bool      // closed under us, or failed a command: the broker has everything back
	lost             []*inHand // settlements that went back with the channel unsent, for cmdDone to report

	// journaledTo: the journal holds what was committed up to this ticket
	// (core_when.go).
	journaledTo uint64
}

func newCore(cfg coreConfig) *core {
	most := max(1, cfg.Max)
	return &core{max: most, size: most, linger: cfg.Linger && most > 1, blame: true,
		maxBody: cfg.MaxBody, canPark: cfg.CanPark}
}

// deliver takes a delivery in hand, with what the shell knows of it
// before decoding (Size, Refused). It reports whether the delivery is to
// be decoded: then the shell decodes it and tells decoded, before
// anything else.
func (c *core) deliver(s *inHand) (decode bool) {
	s.Next = nextPending
	c.hand = append(c.hand, s)
	switch {
	case s.Refused != nil: // never decoded, never applied
		c.letter(s, s.Refused)
	case c.maxBody > 0 && s.Size > c.maxBody:
		c.letter(s, event.Poison(fmt.Errorf("body of %d bytes is over MAX_BODY_BYTES (%d): not decoded", s.Size, c.maxBody)))
	default:
		return true
	}
	c.arrived()
	return false
}

// decoded takes the event decoded from s, or why it could not be: poison,
// or a panic while decoding.
func (c *core) decoded(s *inHand, ev event.Event, err error) {
	s.Event = ev
	if err != nil {
		c.letter(s, err)
	}
	c.arrived()
}

// letter makes s a dead letter for err, the message's own fault (or a
// panic's, blamed on it): its class does not depend on the session's end.
func (c *core) letter(s *inHand, err error) {
	s.Next, s.Err, s.Class = nextLetter, err, classOf(err, nil)
}

// arrived ends the linger once the batch is full.
func (c *core) arrived() {
	if c.busy == cmdWait && !c.backoff && len(c.pending()) >= c.max {
		c.busy, c.lingered = cmdNone, true // the batch is full: no more lingering
	}
}

// retrying reports whether the core is retrying a failure of the
// environment: the queue is blocked.
func (c *core) retrying() bool { return c.failures > 0 }

// pending returns the deliveries in hand still to apply, in order.
func (c *core) pending() []*inHand {
	var out []*inHand
	for _, s := range c.hand {
		if s.Next == nextPending {
			out = append(out, s)
		}
	}
	return out
}

// applied takes the outcome of the attempt under way: one Outcome per
// event when the transaction committed, else the error that failed it
// whole, with why the session had ended when it returned (ended: its
// context's cause; nil while it lasts), which its class depends on
// (classOf).
func (c *core) applied(outs []event.Outcome, err, ended error) {
	class := classOf(err, ended)
	var tried []*inHand
	for _, s := range c.hand {
		if s.Next == nextApplying {
			tried = append(tried, s)
		}
	}
	c.busy = cmdNone
	n := len(tried)
	if err != nil && n == 1 && class == event.ClassConflict {
		// A producer conflict is its event's outcome, not the attempt's.
		outs, err, class = []event.Outcome{{Err: err}}, nil, ""
	}
	if err == nil {
		for i, s := range tried {
			o := outs[i]
			if o.Err != nil { // a producer conflict: that event's own fault
				c.letter(s, o.Err)
				continue
			}
			s.Next, s.Duplicate, s.Outbox = nextAck, o.Duplicate, o.Outbox
			c.blame = true
		}
		c.stopRetrying()
		c.size = min(c.max, c.size*2)
		c.suspects = max(0, c.suspects-n)
		return
	}
	for _, s := range tried {
		s.Next = nextPending
	}
	switch decide(class) {
	case ActionDeadLetter:
		if n > 1 {
			c.suspects = n // the one to blame is among them: try the first half
			return
		}
		c.letter(tried[0], err)
		c.suspects = 0
		return
	case ActionRequeue: // the service is stopping: back to the queue, in order
		for _, s := range tried {
			s.Next, s.Err, s.Class = nextReturn, err, class
		}
		return
	}
	if class == event.ClassPanic {
		if n > 1 {
			c.suspects = n // split, like the message's own fault
			return
		}
		s := tried[0]
		s.Panics++
		if s.Panics >= panicLimit && c.blame {
			c.letter(s, err)
			c.blame, c.suspects = false, 0
			return
		}
	}
	// The environment, nobody knows, or a panic not yet blamed on its
	// message: retry in place, with fewer events.
	c.retryLater(err)
	c.size = max(1, n/2)
	for _, s := range tried {
		s.Retries++
		s.Err, s.Class = err, class
	}
}

// copied takes what became of the dead letter's copy or parking under way.
func (c *core) copied(f copyFact, err error) {
	c.busy = cmdNone
	s := c.copying
	c.copying = nil
	if s == nil || s.Next != nextLetter {
		return
	}
	switch f {
	case factCut: // its answer is to come: until then, as while the alarm blocks
		s.Cut, f = true, factAlarm
	case factUnanswered: // the alarm still holds it
		f = factAlarm
	case factAnswered:
		s.Cut = false
		if err != nil { // not confirmed: publish it again
			s.Park = false
			return
		}
		f = factConfirmed
	}
	switch f {
	case factConfirmed, factParked:
		s.Next, s.Park = nextCopied, false
		c.stopRetrying()
	case factRefused:
		s.Next = nextRefused // the queue dead-letters it
	case factAlarm:
		if c.ending {
			s.Next = nextReturn // nothing new is done once the session ends
		} else {
			s.Park = true
		}
	case factEnded:
		s.Next = nextReturn
	case factParkFailed:
		s.Park = false // the alarm may have passed by the next attempt
		c.retryLater(err)
	}
	if s.Class == event.ClassPanic && s.Next.final() {
		c.blame = false // a panic's letter: until something is applied again, a panic is not the message's
	}
}

// retryLater: the environment failed (err), or may have: the next attempt
// waits a backoff, longer with each failure in a row, and the queue is
// blocked meanwhile (retrying).
func (c *core) retryLater(err error) {
	c.failures++
	c.lastErr = err
	c.backoff = true
}

// stopRetrying: an attempt passed; the queue is no longer blocked, and the
// next failure waits the first backoff.
func (c *core) stopRetrying() { c.failures, c.lastErr, c.backoff = 0, nil, false }

// tick: the wait under way has ended.
func (c *core) tick() {
	if c.busy != cmdWait {
		return // a wait the session's end made moot
	}
	c.busy = cmdNone
	if c.backoff {
		c.backoff = false
	} else {
		c.lingered = true
	}
}

// errReturned is the outcome of a delivery that went back to its queue
// unapplied because the session ended or one before it went back.
var errReturned = errors.New("returned to the queue unapplied, in order")
