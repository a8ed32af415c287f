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
	if c.late {
		c.drop("the shutdown timeout passed")
	}
	// r: the first delivery that goes back; everything behind it goes
	// back with it, and only what is before it is worked on.
	r := len(c.slots)
	for i, s := range c.slots {
		if c.cancelled || s.Fate == fateReturn || (c.ending && !s.Fate.final()) {
			r = i
			break
		}
	}
	if cmd, ok := c.settle(r); ok {
		return cmd
	}
	if c.busy != cmdNone {
		return command{Await: c.awaiting()} // a wait under way: the journal may let a settlement go meanwhile
	}
	head := c.slots[:r]
	if cmd, ok := c.work(head, r == len(c.slots)); ok {
		return cmd
	}
	switch {
	case r == 0 && len(c.slots) > 0:
		return c.giveBack()
	case c.awaiting() != 0:
		// Settlements wait for the journal: once the session ended, the
		// close waits for them too, until the shutdown timeout passes.
		return command{Await: c.awaiting()}
	case c.ending:
		c.done = true
		if c.closedErr {
			return c.next()
		}
		// Deliveries may be on their way: closing returns them.
		return command{Kind: cmdClose}
	}
	return command{}
}

// work returns the next command for head, the slots before any that goes
// back: copy or park a dead letter, wait a backoff, or apply what is
// pending (after the linger, when all has arrived and more may come).
func (c *core) work(head []*slot, mayLinger bool) (command, bool) {
	if c.ending {
		return command{}, false
	}
	var pending []*slot
	var letter, first *slot
slots:
	for _, s := range head {
		switch s.Fate {
		case fatePending:
			pending = append(pending, s)
		case fateLetter:
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
		if s.Fate == fateLetter && s.Class == event.ClassPanic {
			// What is behind a panic's letter waits until it is settled:
			// unlike the message's other faults, a panic may not come
			// again, and a letter held, or returned before its copy, is
			// applied the next time, after anything applied behind it.
			break slots
		}
	}
	if first == nil {
		return command{}, false
	}
	if letter != nil && letter.Class == event.ClassPanic && letter.Panics == 0 && !c.blame && !c.backoff {
		// Decoding it panicked, and the queue has applied nothing since
		// another panic's dead letter: the service is broken, not the
		// message. It waits in place, as long as it takes.
		c.failures++
		c.lastErr = letter.Err
		c.backoff = true
	}
	if c.backoff {
		c.busy = cmdWait
		return command{Kind: cmdWait, Attempt: c.failures - 1, Blocked: first, Err: c.lastErr, Await: c.awaiting()}, true
	}
	if letter != nil {
		kind := cmdCopy
		if letter.Park {
			kind = cmdPark
		}
		c.busy, c.copying = kind, letter
		// Without a parker, the copy waits for any alarm to pass.
		return command{Kind: kind, Slots: []*slot{letter}, Force: !c.canPark}, true
	}
	n := min(c.max, c.size, len(pending))
	if c.span > 0 {
		n = min(n, max(1, c.span/2))
	}
	if mayLinger && c.linger && !c.lingered && c.span == 0 && c.failures == 0 && len(pending) < c.max {
		c.busy = cmdWait
		return command{Kind: cmdWait, Linger: true, Await: c.awaiting()}, true
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
// last of them. It settles only a run of final slots from the first, each
// held by the journal (core_when.go): none passes one that waits for it.
func (c *core) settle(upto int) (command, bool) {
	k := 0
	for k < upto && c.slots[k].Fate.final() && c.held(c.slots[k]) {
		k++
	}
	if k == 0 {
		return command{}, false
	}
	for i, s := range c.slots[:k] {
		if s.Fate == fateRefused {
			c.slots = append(c.slots[:i:i], c.slots[i+1:]...)
			return command{Kind: cmdReject, Tag: s.Tag, Settled: settlements(s)}, true
		}
	}
	settled := c.slots[:k:k]
	c.slots = c.slots[k:]
	last := settled[k-1]
	return command{Kind: cmdAck, Tag: last.Tag, Multiple: k > 1, Settled: settlements(settled...)}, true
}

// giveBack returns every slot in hand by closing the channel, which
// returns them together, in order, before the queue's next consumer gets
// anything; the worker then ends.
func (c *core) giveBack() command {
	for _, s := range c.slots {
		s.Fate = fateReturn
	}
	cmd := command{Kind: cmdClose, Settled: settlements(c.slots...)}
	c.slots, c.done = nil, true
	return cmd
}

// settlements returns the decision about each of slots, final or returned.
func settlements(slots ...*slot) []settlement {
	out := make([]settlement, len(slots))
	for i, s := range slots {
		d := settlement{Slot: s}
		switch s.Fate {
		case fateAck:
			d.Action = ActionAck
		case fateCopied, fateRefused:
			d.Action, d.Class, d.Err = ActionDeadLetter, s.Class, s.Err
		default: // fateReturn
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
