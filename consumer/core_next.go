package consumer

import "transferconsumer/event"

// next returns the one command to carry out now: cmdNone while a command
// under way has not reported back or nothing is to be done until a
// delivery arrives or the journal holds the ticket it names (Await).
func (c *core) next() command {
	if c.done {
		lost := c.lost
		c.lost = nil
		return command{Kind: cmdDone, Settled: settlements(lost...)}
	}
	if c.shutdownTimedOut {
		c.returnWaiting("the shutdown timeout passed")
	}
	// firstBack: the first delivery that goes back; everything behind it
	// goes back with it, and only what is before it is worked on.
	firstBack := len(c.hand)
	for i, s := range c.hand {
		if c.cancelled || s.Next == nextReturn || (c.ending && !s.Next.final()) {
			firstBack = i
			break
		}
	}
	if cmd, ok := c.settle(firstBack); ok {
		return cmd
	}
	if c.busy != cmdNone {
		return command{Await: c.awaiting()} // a wait under way: the journal may let a settlement go meanwhile
	}
	head := c.hand[:firstBack]
	if cmd, ok := c.work(head, firstBack == len(c.hand)); ok {
		return cmd
	}
	switch {
	case firstBack == 0 && len(c.hand) > 0:
		return c.giveBack()
	case c.awaiting() != 0:
		// Settlements wait for the journal: once the session ended, the
		// close waits for them too, until the shutdown timeout passes.
		return command{Await: c.awaiting()}
	case c.ending:
		c.done = true
		if c.channelGone {
			return c.next()
		}
		// Deliveries may be on their way: closing returns them.
		return command{Kind: cmdClose}
	}
	return command{}
}

// work returns the next command for head, the deliveries before any that goes
// back: copy or park a dead letter, wait a backoff, or apply what is
// pending (after the linger, when all has arrived and more may come).
func (c *core) work(head []*inHand, mayLinger bool) (command, bool) {
	if c.ending {
		return command{}, false
	}
	var pending []*inHand
	var letter, first *inHand
hand:
	for _, s := range head {
		switch s.Next {
		case nextPending:
			pending = append(pending, s)
		case nextLetter:
			// A panic's letter waits for the deliveries pending before
			// it: one of them may take the blame first (core.applied).
			if letter == nil && (s.Class != event.ClassPanic || len(pending) == 0) {
				letter = s
			}
		default:
			continue
		}
		if first == nil {
			first = s
		}
		if s.Next == nextLetter && s.Class == event.ClassPanic {
			// What is behind a panic's letter waits until it is settled:
			// unlike the message's other faults, a panic may not come
			// again, and a letter held, or returned before its copy, is
			// applied the next time, after anything applied behind it.
			break hand
		}
	}
	if first == nil {
		return command{}, false
	}
	if letter != nil && letter.Class == event.ClassPanic && letter.Panics == 0 && !c.blame && !c.backoff {
		// Decoding it panicked, and the queue has applied nothing since
		// another panic's dead letter: the service is broken, not the
		// message. It waits in place, as long as it takes.
		c.retryLater(letter.Err)
	}
	if c.backoff {
		c.busy = cmdWait
		return command{Kind: cmdWait, Attempt: c.failures - 1, Blocked: first, Err: c.lastErr, Class: classOf(c.lastErr, nil),
			Await: c.awaiting()}, true
	}
	if letter != nil {
		kind := cmdCopy
		if letter.Park {
			kind = cmdPark
		}
		c.busy, c.copying = kind, letter
		// Without a parker, the copy waits for any alarm to pass.
		return command{Kind: kind, Hand: []*inHand{letter}, Force: !c.canPark, Answer: letter.Cut && kind == cmdCopy}, true
	}
	n := min(c.max, c.size, len(pending))
	if c.suspects > 0 {
		n = min(n, max(1, c.suspects/2))
	}
	if mayLinger && c.linger && !c.lingered && c.suspects == 0 && c.failures == 0 && len(pending) < c.max {
		c.busy = cmdWait
		return command{Kind: cmdWait, Linger: true, Await: c.awaiting()}, true
	}
	c.lingered = false
	for _, s := range pending[:n] {
		s.Next = nextApplying
	}
	c.busy = cmdApply
	return command{Kind: cmdApply, Hand: pending[:n]}, true
}

// settle returns the command that settles the final deliveries among the first
// upto, if any: the reject of a refused one first, so that no multiple ack
// covers it; then one ack, multiple when it covers several, naming the
// last of them. It settles only a run of final deliveries from the first, each
// held by the journal (core_when.go): none passes one that waits for it.
func (c *core) settle(upto int) (command, bool) {
	k := 0
	for k < upto && c.hand[k].Next.final() && c.journalHolds(c.hand[k]) {
		k++
	}
	if k == 0 {
		return command{}, false
	}
	for i, s := range c.hand[:k] {
		if s.Next == nextRefused {
			c.hand = append(c.hand[:i:i], c.hand[i+1:]...)
			return command{Kind: cmdReject, Tag: s.Tag, Settled: settlements(s)}, true
		}
	}
	settled := c.hand[:k:k]
	c.hand = c.hand[k:]
	last := settled[k-1]
	return command{Kind: cmdAck, Tag: last.Tag, Multiple: k > 1, Settled: settlements(settled...)}, true
}

// giveBack returns every delivery in hand by closing the channel, which
// returns them together, in order, before the queue's next consumer gets
// anything; the worker then ends.
func (c *core) giveBack() command {
	for _, s := range c.hand {
		s.Next = nextReturn
	}
	cmd := command{Kind: cmdClose, Settled: settlements(c.hand...)}
	c.hand, c.done = nil, true
	return cmd
}

// settlements returns the decision about each delivery of hand, final or returned.
func settlements(hand ...*inHand) []settlement {
	out := make([]settlement, len(hand))
	for i, s := range hand {
		d := settlement{Slot: s}
		switch s.Next {
		case nextAck:
			d.Action = ActionAck
		case nextCopied, nextRefused:
			d.Action, d.Class, d.Err = ActionDeadLetter, s.Class, s.Err
		default: // nextReturn
			d.Action, d.Class, d.Err = ActionRequeue, s.Class, s.Err
			if d.Class == "" {
				d.Class = event.ClassShutdown // returned unapplied, not for its own fault
			}
			if d.Err == nil {
				d.Err = errReturned
			}
		}
		out[i] = d
	}
	return out
}
