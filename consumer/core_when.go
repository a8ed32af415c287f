package consumer

import (
	"fmt"

	"transferconsumer/event"
)

// When the core's settlements go, and what ends them: the journal holding
// the entries (confirmed by its stream, or kept in the database during an
// alarm), the session's end, the shutdown timeout, the broker's cancel,
// the channel's loss. The way raft is told what its storage made durable,
// the core is told which journal ticket the deliveries of the command
// under way wait for (journaling) and up to which ticket the journal
// holds what was committed (journaled). It settles a delivery only once
// the journal holds its ticket, and only from the first in hand, in
// order (settle, core_next.go): no ack or reject passes one that waits.
// While one waits, its command names the ticket (Await), which the worker
// watches. The worker decides none of it.

// journaling: the command under way (an apply, a park) committed, or may
// have committed (an attempt that failed: a producer conflict, a COMMIT
// whose answer was lost), what the journal holds only once ticket is
// journaled: the settlements of its deliveries wait for it. Tickets grow,
// and each covers everything committed before it.
func (c *core) journaling(ticket uint64) {
	switch c.busy {
	case cmdApply:
		for _, s := range c.hand {
			if s.Next == nextApplying {
				s.Ticket = ticket
			}
		}
	case cmdCopy, cmdPark:
		if c.copying != nil {
			c.copying.Ticket = ticket
		}
	}
}

// journaled: the journal holds everything committed up to ticket.
func (c *core) journaled(ticket uint64) { c.journaledTo = max(c.journaledTo, ticket) }

// journalHolds reports whether the journal holds what s's settlement
// waits for.
func (c *core) journalHolds(s *inHand) bool { return s.Ticket <= c.journaledTo }

// awaiting returns the ticket the first delivery in hand waits for when
// it is final and the journal does not hold it yet: nothing is settled
// until then. Else 0.
func (c *core) awaiting() uint64 {
	if len(c.hand) == 0 || c.shutdownTimedOut || c.cancelled {
		return 0
	}
	if s := c.hand[0]; s.Next.final() && !c.journalHolds(s) {
		return s.Ticket
	}
	return 0
}

// end: the session ended (shutdown, or a failure elsewhere). Nothing new
// is applied; a wait under way stops. What is final is still settled as
// the journal holds it, until the shutdown timeout passes (expired).
func (c *core) end() {
	c.ending = true
	if c.busy == cmdWait {
		c.busy = cmdNone
	}
}

// expired: the shutdown timeout passed (the work's context ended). The
// session ends, if it had not, and the settlements that wait for the
// journal are given up (returnWaiting, in next): their deliveries go back
// with the rest, by the close.
func (c *core) expired() {
	c.end()
	c.shutdownTimedOut = true
}

// cancel: the broker cancelled the consumer (from 4.3 its consumer timeout
// does so, and has already returned what the consumer held). Nothing more
// is settled or applied, not even what commits after the cancel, nor what
// waits for the journal: on 4.3 a late ack would make this consumer the
// queue's active one again, unknown to the client. The channel is closed,
// which returns whatever the broker still counts as held, in order; what
// had committed comes back as duplicates.
func (c *core) cancel() {
	c.end()
	c.cancelled = true
	c.returnWaiting("the broker cancelled the consumer")
}

// channelClosed: the channel is gone, and with it everything in hand: the
// broker returns what was not settled, and the settlements that waited
// for the journal go back with it (cmdDone reports them).
func (c *core) channelClosed() { c.loseChannel("the channel closed") }

// commandFailed: the channel failed cmd (an ack, a reject) with err. A
// channel that fails a command is closed by the broker (an unknown tag
// is a 406), or was lost under it: the core takes it as gone, and does
// nothing more on it. What cmd settled left the hand when it was given;
// the settlements that waited for the journal go back, each saying which
// command failed and why.
func (c *core) commandFailed(cmd command, err error) {
	c.loseChannel(fmt.Sprintf("the channel failed the %s of tag %d (%v)", cmd.Kind, cmd.Tag, err))
}

// loseChannel: the channel is gone (why).
func (c *core) loseChannel(why string) {
	c.lost = append(c.lost, c.returnWaiting(why)...)
	c.channelGone = true
	c.ending = true
	c.busy = cmdNone
	c.hand = nil
}

// returnWaiting gives up the settlements that wait for the journal, from
// the first final delivery the journal does not hold, with the final ones
// behind it: they go back to the queue, by the close, in order, for why;
// and it returns them. What had committed comes back as a duplicate, which the
// inbox drops and the journal takes again.
func (c *core) returnWaiting(why string) []*inHand {
	var out []*inHand
	waiting := false
	for _, s := range c.hand {
		if !s.Next.final() {
			break
		}
		if waiting = waiting || !c.journalHolds(s); !waiting {
			continue
		}
		action := ActionAck
		if s.Next != nextAck {
			action = ActionDeadLetter
		}
		s.Next, s.Class = nextReturn, event.ClassShutdown
		s.Err = fmt.Errorf("%s before its settlement (%s) could be sent: it goes back to the queue; "+
			"committed, it comes back as a duplicate", why, action)
		out = append(out, s)
	}
	return out
}
