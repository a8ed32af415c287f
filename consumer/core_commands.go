package consumer

import "transferconsumer/event"

// What the core tells the worker (commands, and the decision about each
// delivery they settle) and what becomes of a dead letter's copy, which
// the worker tells it (core.go).

// cmdKind is a kind of command the core gives the worker.
type cmdKind int

const (
	cmdNone   cmdKind = iota // nothing to do until something happens (journal ticket Await, if any, is journaled)
	cmdApply                 // apply the events of Hand in one transaction, once; then applied
	cmdCopy                  // publish the dead-letter copy of Hand[0] and await its confirm (Answer: look for the answer to its cut publish); then copied
	cmdPark                  // park the dead letter of Hand[0] in the database; then copied
	cmdWait                  // wait the backoff of retry Attempt (or the batch linger); then tick
	cmdAck                   // ack Tag, Multiple: it settles Settled
	cmdReject                // reject Tag without requeue (the queue dead-letters it): it settles Settled
	cmdClose                 // close the channel, which returns Settled in order
	cmdDone                  // the worker is finished; Settled went back with the lost channel unsettled
)

var cmdNames = [...]string{"none", "apply", "copy", "park", "wait", "ack", "reject", "close", "done"}

func (k cmdKind) String() string { return cmdNames[k] }

// command is what the worker is to do next.
type command struct {
	Kind     cmdKind
	Hand     []*inHand // cmdApply, cmdCopy, cmdPark
	Settled  []settlement
	Tag      uint64
	Multiple bool
	Attempt  int  // cmdWait: the 0-based retry whose backoff to wait
	Linger   bool // cmdWait: wait for more deliveries instead
	// Force (cmdCopy): publish even while an alarm blocks publishing, and
	// wait for the confirm however long the alarm lasts.
	Force bool
	// Answer (cmdCopy): publish nothing; look whether the publish of Hand[0]
	// that an alarm cut short has been answered (factAnswered) or not
	// (factUnanswered).
	Answer bool
	// Blocked (cmdWait of a retry): the delivery the queue is held on,
	// the environment's last failure, and its class.
	Blocked *inHand
	Err     error
	Class   event.Class
	// Await (cmdNone, cmdWait): the journal ticket the settlements in
	// hand wait for the journal to hold (then journaled); 0: none.
	Await uint64
}

// settlement is the decision about one delivery that a command settles.
type settlement struct {
	Slot   *inHand
	Action Action
	Class  event.Class // "" when acked after its commit
	Err    error       // why it is not simply acked; nil when it is
}

// copyFact is what became of a dead letter's copy, or of its parking.
type copyFact int

const (
	factConfirmed  copyFact = iota // the broker confirmed the copy
	factRefused                    // nacked, unroutable, refused, or the publish failed
	factAlarm                      // a broker alarm blocks publishing: nothing was sent
	factCut                        // sent, but an alarm began and cut the wait for its confirm short: its answer is to come
	factEnded                      // the session ended before the confirm
	factParked                     // parked in the database
	factParkFailed                 // the database could not park it
	factAnswered                   // the publish an alarm cut short was answered: confirmed when err is nil
	factUnanswered                 // the publish an alarm cut short has no answer yet
)

var factNames = [...]string{"confirmed", "refused", "alarm", "cut", "ended", "parked", "park failed", "answered", "unanswered"}

func (f copyFact) String() string { return factNames[f] }
