package consumer

import (
	"context"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"
)

// The decisions about one queue's deliveries, as a plain value without I/O
// (see adr/0002 and adr/0006). The worker (worker.go) feeds it what
// happened (a delivery arrived, an attempt to apply returned, a dead-letter
// copy was confirmed, a wait ended, the session ended, the channel closed)
// and carries out the one command it returns at a time: apply these
// events, copy this one to the DLQ, wait, ack, reject, close the channel.
// model_test.go drives it through thousands of random schedules against a
// model of the broker and the database.
//
// The rules it keeps:
//   - A delivery is acked only once it is final: applied (or a duplicate)
//     in a committed transaction, or dead-lettered with its copy confirmed.
//     A multiple ack names a final delivery and covers only final ones:
//     the rejects of the refused go out before it.
//   - Nothing behind a delivery that goes back to the queue is applied or
//     settled: it all goes back with it, in order, by closing the channel.
//     A cancel would hand the queue to the next single active consumer
//     while the held messages are still out, and they would come back
//     behind what it took meanwhile.
//   - Once the session ends, nothing new is applied: what is final is
//     settled, the rest goes back by closing the channel.
//   - An attempt of several events that fails because of one of them (or
//     panics) is split: its first half is tried, until the event that
//     fails stands alone and takes the blame alone. One that the
//     environment fails is retried in place, after a backoff, with half as
//     many events (a batch slower than the apply timeout shrinks until it
//     passes); success doubles the size again.
//   - A panic is retried in place, like a failure nobody classified: the
//     message stays in hand, so nothing behind it moves and no delivery is
//     spent. After panicLimit panics of one event alone it is
//     dead-lettered as the message's own fault, but only when the queue
//     applied something since its last such dead letter: a bug that hits
//     every message dead-letters at most one, then holds the queue,
//     visibly, until it is fixed. A crash of the whole process is ended
//     by the quorum queue's delivery limit instead.
//   - The core never returns a message by itself with Nack or Reject: a
//     return goes to the back of the queue's returned messages, behind
//     any returned before it, and only a close returns a consumer's
//     messages together, in order.

// fate is what becomes of a delivery in hand.
type fate int

const (
	fatePending  fate = iota // to apply
	fateApplying             // in the attempt under way
	fateAck                  // applied or a duplicate: ack it
	fateLetter               // its own fault: copy it to the DLQ, then ack it
	fateCopied               // its dead-letter copy is confirmed: ack it
	fateRefused              // its copy was refused: reject it without requeue (the queue dead-letters it)
	fateReturn               // back to the queue, in order, with everything behind it
)

// panicLimit is how many times one event alone may panic before it is
// dead-lettered (see core).
const panicLimit = 3

// final reports whether f needs nothing more than its settlement.
func (f fate) final() bool { return f == fateAck || f == fateCopied || f == fateRefused }

// slot is one delivery in hand.
type slot struct {
	Tag   uint64
	Event Event // decoded, unless Err says why it could not be
	Fate  fate
	Class Class // why it is not simply applied ("" when it was)
	Err   error
	// Duplicate and Outbox are what applying it did.
	Duplicate, Outbox bool
	Retries           int // failed attempts of the environment it was part of
	Panics            int // attempts of it alone that panicked

	// The worker's, which the core never reads.
	d     amqp.Delivery
	span  trace.Span
	start time.Time
}

// cmdKind is a kind of command the core gives the worker.
type cmdKind int

const (
	cmdNone   cmdKind = iota // nothing to do until something happens
	cmdApply                 // apply Slots' events in one transaction, once; then applied
	cmdCopy                  // publish the dead-letter copy of Slots[0] (or park it); then copied
	cmdWait                  // wait the backoff of retry Attempt (or the batch linger); then tick
	cmdAck                   // ack Tag, Multiple: it settles Slots
	cmdReject                // reject Slots[0] without requeue: the queue dead-letters it
	cmdClose                 // close the channel, which returns Slots in order
	cmdDone                  // the worker is finished
)

var cmdNames = [...]string{"none", "apply", "copy", "wait", "ack", "reject", "close", "done"}

func (k cmdKind) String() string { return cmdNames[k] }

// command is what the worker is to do next.
type command struct {
	Kind     cmdKind
	Slots    []*slot
	Tag      uint64
	Multiple bool
	Attempt  int  // cmdWait: the 0-based retry whose backoff to wait
	Linger   bool // cmdWait: wait for more deliveries instead
}

// copyResult is what became of a dead letter's copy.
type copyResult int

const (
	copied      copyResult = iota // confirmed by the broker, or parked in the database
	copyRefused                   // nacked, unroutable, or the publish failed: reject the original without requeue
	copyCut                       // the session ended first: return the original
	copyFailed                    // neither published nor parked, for the environment's reasons: try again after a backoff
)

// core decides what happens to the deliveries of one queue's consumer.
type core struct {
	max    int  // BATCH_MAX: the prefetch, and the most events in one transaction
	linger bool // wait BATCH_LINGER for more before applying fewer than max
	// blame: a panic may be blamed on its message; false from a panic's
	// dead letter until something is applied again.
	blame bool

	slots []*slot // in hand, in delivery order
	busy  cmdKind // cmdApply, cmdCopy or cmdWait under way; else cmdNone

	size     int   // the most events the next attempt takes
	span     int   // pending slots, from the first, known to hold one that fails alone
	failures int   // consecutive failures of the environment
	backoff  bool  // a wait is due before the next attempt
	lastErr  error // the environment's last failure, while failures > 0
	lingered bool  // the linger of the batch being gathered has passed

	ending    bool // the session ended or the broker cancelled the consumer
	done      bool
	closedErr bool // the channel closed under us: the broker has everything back
}

func newCore(max int, linger bool) *core {
	max = maxInt(1, max)
	return &core{max: max, size: max, linger: linger && max > 1, blame: true}
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}

// deliver takes a delivery in hand: ev decoded, or err saying why it could
// not be (poison, or a panic while decoding, as class).
func (c *core) deliver(s *slot) {
	s.Fate = fatePending
	if s.Err != nil { // poison, or a panic while decoding (see work)
		s.Fate = fateLetter
	}
	c.slots = append(c.slots, s)
	if c.busy == cmdWait && !c.backoff && len(c.pending()) >= c.max {
		c.busy, c.lingered = cmdNone, true // the batch is full: no more lingering
	}
}

// pending returns the slots still to apply, in order.
func (c *core) pending() []*slot {
	var out []*slot
	for _, s := range c.slots {
		if s.Fate == fatePending {
			out = append(out, s)
		}
	}
	return out
}

// applied takes the outcome of the attempt under way: one Outcome per
// event when the transaction committed, else the error (of class) that
// failed it whole.
func (c *core) applied(outs []Outcome, err error, class Class) {
	var tried []*slot
	for _, s := range c.slots {
		if s.Fate == fateApplying {
			tried = append(tried, s)
		}
	}
	c.busy = cmdNone
	n := len(tried)
	if err == nil {
		for i, s := range tried {
			o := outs[i]
			if o.Err != nil { // a producer conflict: that event's own fault
				s.Fate, s.Err, s.Class = fateLetter, o.Err, ClassOf(context.Background(), o.Err)
				continue
			}
			s.Fate, s.Duplicate, s.Outbox = fateAck, o.Duplicate, o.Outbox
			c.blame = true
		}
		c.failures, c.lastErr, c.backoff = 0, nil, false
		c.size = min(c.max, c.size*2)
		c.span = maxInt(0, c.span-n)
		return
	}
	for _, s := range tried {
		s.Fate = fatePending
	}
	switch {
	case n > 1 && (causedByMessage(class) || class == ClassPanic):
		c.span = n // the one to blame is among them: try the first half
		return
	case causedByMessage(class):
		tried[0].Fate, tried[0].Err, tried[0].Class = fateLetter, err, class
		c.span = 0
		return
	case class == ClassPanic:
		s := tried[0]
		s.Panics++
		if s.Panics >= panicLimit && c.blame {
			s.Fate, s.Err, s.Class = fateLetter, err, class
			c.blame, c.span = false, 0
			return
		}
	}
	// The environment, nobody knows, or a panic not yet blamed on its
	// message: retry in place, with fewer events.
	c.failures++
	c.lastErr = err
	c.backoff = true
	c.size = maxInt(1, n/2)
	for _, s := range tried {
		s.Retries++
		s.Err, s.Class = err, class
	}
}

// copied takes what became of the dead-letter copy under way.
func (c *core) copied(r copyResult, err error) {
	c.busy = cmdNone
	var s *slot
	for _, x := range c.slots {
		if x.Fate == fateLetter {
			s = x
			break
		}
	}
	if s == nil {
		return
	}
	switch r {
	case copied:
		s.Fate = fateCopied
		c.failures, c.lastErr, c.backoff = 0, nil, false
		if s.Class == ClassPanic {
			c.blame = false
		}
	case copyRefused:
		s.Fate = fateRefused
	case copyCut:
		s.Fate = fateReturn
	case copyFailed:
		c.failures++
		c.lastErr = err
		c.backoff = true
	}
}

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

// end: the session ended (shutdown, or a failure elsewhere), or the broker
// cancelled the consumer. Nothing new is applied; a wait under way stops.
func (c *core) end() {
	c.ending = true
	if c.busy == cmdWait {
		c.busy = cmdNone
	}
}

// cancelled: the broker cancelled the consumer (from 4.3 its consumer
// timeout does so, and has already returned what the consumer held, so an
// ack would no longer remove anything). Nothing more is settled or applied:
// the channel is closed, which returns whatever the broker still counts as
// held, in order; what had committed comes back as duplicates.
func (c *core) cancelled() {
	c.end()
	for _, s := range c.slots {
		if s.Fate != fateApplying {
			s.Fate = fateReturn
		}
	}
}

// channelClosed: the channel is gone, and with it everything in hand: the
// broker returns what was not settled.
func (c *core) channelClosed() {
	c.closedErr = true
	c.ending = true
	c.busy = cmdNone
	c.slots = nil
}

// next returns the one command to carry out now: cmdNone while a command
// under way has not reported back or nothing is to be done until a
// delivery arrives.
func (c *core) next() command {
	if c.done {
		return command{Kind: cmdDone}
	}
	if c.busy != cmdNone {
		return command{}
	}
	// r: the first delivery that goes back; everything behind it goes
	// back with it, and only what is before it is worked on.
	r := len(c.slots)
	for i, s := range c.slots {
		if s.Fate == fateReturn || (c.ending && !s.Fate.final()) {
			r = i
			break
		}
	}
	if cmd, ok := c.settle(r); ok {
		return cmd
	}
	head := c.slots[:r]
	if cmd, ok := c.work(head, r == len(c.slots)); ok {
		return cmd
	}
	switch {
	case r == 0 && len(c.slots) > 0:
		return c.giveBack()
	case c.ending:
		c.done = true
		if c.closedErr {
			return command{Kind: cmdDone}
		}
		// Deliveries may be on their way: closing returns them.
		return command{Kind: cmdClose}
	}
	return command{}
}

// work returns the next command for head, the slots before any that goes
// back: copy a dead letter, wait a backoff, or apply what is pending (after
// the linger, when all has arrived and more may come).
func (c *core) work(head []*slot, mayLinger bool) (command, bool) {
	if c.ending {
		return command{}, false
	}
	var pending []*slot
	var letter *slot
	for _, s := range head {
		switch s.Fate {
		case fatePending:
			pending = append(pending, s)
		case fateLetter:
			if letter == nil {
				letter = s
			}
		}
	}
	if letter == nil && len(pending) == 0 {
		return command{}, false
	}
	if letter != nil && letter.Class == ClassPanic && letter.Panics == 0 && !c.blame {
		// Decoding it panicked, right after another panic's dead letter:
		// the service is broken, not the message. It waits in place.
		if !c.backoff {
			c.failures++
			c.lastErr = letter.Err
		}
		c.backoff = true
		letter.Panics = -1 // counted once
	}
	if c.backoff {
		c.busy = cmdWait
		return command{Kind: cmdWait, Attempt: c.failures - 1}, true
	}
	if letter != nil {
		c.busy = cmdCopy
		return command{Kind: cmdCopy, Slots: []*slot{letter}}, true
	}
	n := min(c.max, c.size, len(pending))
	if c.span > 0 {
		n = min(n, maxInt(1, c.span/2))
	}
	if mayLinger && c.linger && !c.lingered && c.span == 0 && c.failures == 0 && len(pending) < c.max {
		c.busy = cmdWait
		return command{Kind: cmdWait, Linger: true}, true
	}
	c.lingered = false
	for _, s := range pending[:n] {
		s.Fate = fateApplying
	}
	c.busy = cmdApply
	return command{Kind: cmdApply, Slots: pending[:n]}, true
}

// settle returns the command that settles the final slots among the first
// upto, if any: the reject of a refused one first, so that no multiple ack
// covers it; then one ack, multiple when it covers several, naming the
// last of them. It settles only a run of final slots from the first.
func (c *core) settle(upto int) (command, bool) {
	k := 0
	for k < upto && c.slots[k].Fate.final() {
		k++
	}
	if k == 0 {
		return command{}, false
	}
	for i, s := range c.slots[:k] {
		if s.Fate == fateRefused {
			c.slots = append(c.slots[:i:i], c.slots[i+1:]...)
			return command{Kind: cmdReject, Slots: []*slot{s}}, true
		}
	}
	settled := c.slots[:k:k]
	c.slots = c.slots[k:]
	last := settled[k-1]
	return command{Kind: cmdAck, Tag: last.Tag, Multiple: k > 1, Slots: settled}, true
}

// giveBack returns every slot in hand by closing the channel, which
// returns them together, in order, before the queue's next consumer gets
// anything; the worker then ends.
func (c *core) giveBack() command {
	for _, s := range c.slots {
		s.Fate = fateReturn
	}
	cmd := command{Kind: cmdClose, Slots: c.slots}
	c.slots, c.done = nil, true
	return cmd
}
