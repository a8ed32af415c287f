package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"transferconsumer/event"
)

// A few schedules of the core spelled out, as a reader would follow them;
// model_test.go runs thousands of random ones.

// drive feeds the core and records the commands it gives, answering each
// apply with result(tags) and each copy with copied. It stops at cmdNone
// or cmdDone.
func drive(c *core, result func(tags []uint64) ([]event.Outcome, error)) []string {
	var log []string
	for i := 0; i < 100; i++ {
		cmd := c.next()
		var tags []uint64
		for _, s := range cmd.Hand {
			tags = append(tags, s.Tag)
		}
		for _, st := range cmd.Settled {
			if cmd.Kind != cmdAck {
				tags = append(tags, st.Slot.Tag)
			}
		}
		switch cmd.Kind {
		case cmdNone, cmdDone:
			return append(log, cmd.Kind.String())
		case cmdApply:
			outs, err := result(tags)
			log = append(log, fmt.Sprintf("apply %v", tags))
			c.applied(outs, err, nil)
		case cmdCopy:
			log = append(log, fmt.Sprintf("copy %v", tags))
			c.copied(factConfirmed, nil)
		case cmdWait:
			log = append(log, "wait")
			c.tick()
		case cmdAck:
			log = append(log, fmt.Sprintf("ack %d multiple=%v", cmd.Tag, cmd.Multiple))
		case cmdReject:
			log = append(log, fmt.Sprintf("reject %v", tags))
		case cmdClose:
			log = append(log, fmt.Sprintf("close returning %v", tags))
		}
	}
	return append(log, "…")
}

func deliverN(c *core, n int, bad ...uint64) {
	for tag := uint64(1); tag <= uint64(n); tag++ {
		s := &inHand{Tag: tag}
		ev, err := event.Event{ID: fmt.Sprint(tag)}, error(nil)
		for _, b := range bad {
			if b == tag {
				err = event.Poison(errors.New("not JSON"))
			}
		}
		if c.deliver(s) {
			c.decoded(s, ev, err)
		}
	}
}

func ok(tags []uint64) ([]event.Outcome, error) {
	return make([]event.Outcome, len(tags)), nil
}

func TestCoreSchedules(t *testing.T) {
	transient := event.Transient(errors.New("connection refused"))
	tests := []struct {
		name   string
		max    int
		n      int
		poison []uint64
		result func(c *core, tags []uint64) ([]event.Outcome, error)
		want   string
		prefix bool // want is how it starts; it goes on the same way
	}{
		{name: "a batch commits, one multiple ack", max: 50, n: 3,
			want: "apply [1 2 3]; ack 3 multiple=true; none"},
		{name: "poison is copied, the rest applied, one ack covers both", max: 50, n: 3, poison: []uint64{2},
			want: "copy [2]; apply [1 3]; ack 3 multiple=true; none"},
		{name: "an event the database refuses is found by halves; only it is dead-lettered", max: 50, n: 4,
			result: func(_ *core, tags []uint64) ([]event.Outcome, error) {
				for _, tag := range tags {
					if tag == 3 {
						return nil, event.Rejected(errors.New("22003"))
					}
				}
				return make([]event.Outcome, len(tags)), nil
			},
			want: "apply [1 2 3 4]; apply [1 2]; ack 2 multiple=true; apply [3]; copy [3]; ack 3 multiple=false; apply [4]; ack 4 multiple=false; none"},
		{name: "the environment fails a batch: retried in place with half as many", max: 50, n: 4,
			result: func(c *core, tags []uint64) ([]event.Outcome, error) {
				if len(tags) > 2 {
					return nil, transient
				}
				return make([]event.Outcome, len(tags)), nil
			},
			want: "apply [1 2 3 4]; wait; apply [1 2]; ack 2 multiple=true; apply [3 4]; ack 4 multiple=true; none"},
		{name: "a panic is retried in place, then dead-lettered; the event behind waits for it", max: 1, n: 2,
			result: func(_ *core, tags []uint64) ([]event.Outcome, error) {
				if tags[0] == 1 {
					return nil, event.Panicked(errors.New("panic: boom"))
				}
				return make([]event.Outcome, len(tags)), nil
			},
			want: "apply [1]; wait; apply [1]; wait; apply [1]; copy [1]; ack 1 multiple=false; apply [2]; ack 2 multiple=false; none"},
		{name: "a second panic with nothing applied since is the service's: it stays in place", max: 1, n: 2,
			result: func(_ *core, tags []uint64) ([]event.Outcome, error) {
				return nil, event.Panicked(errors.New("panic: boom"))
			},
			want: "apply [1]; wait; apply [1]; wait; apply [1]; copy [1]; ack 1 multiple=false; " +
				strings.Repeat("apply [2]; wait; ", 10), prefix: true},
		{name: "the session ends while the environment fails: nothing more applied, all returned by the close", max: 50, n: 3,
			result: func(c *core, tags []uint64) ([]event.Outcome, error) {
				c.end()
				return nil, transient
			},
			want: "apply [1 2 3]; close returning [1 2 3]; done"},
		{name: "the session ends after a commit: ack what committed, return the rest", max: 2, n: 3,
			result: func(c *core, tags []uint64) ([]event.Outcome, error) {
				c.end()
				return make([]event.Outcome, len(tags)), nil
			},
			want: "apply [1 2]; ack 2 multiple=true; close returning [3]; done"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCore(coreConfig{Max: tt.max})
			deliverN(c, tt.n, tt.poison...)
			result := func(tags []uint64) ([]event.Outcome, error) {
				if tt.result == nil {
					return ok(tags)
				}
				return tt.result(c, tags)
			}
			got := strings.Join(drive(c, result), "; ")
			if tt.prefix && strings.HasPrefix(got, tt.want) && strings.Count(got, "copy") == strings.Count(tt.want, "copy") {
				return
			}
			if got != tt.want {
				t.Errorf("\ngot  %s\nwant %s", got, tt.want)
			}
		})
	}
}

// A refused copy is rejected (the queue's own dead-lettering keeps it)
// before any multiple ack could cover it.
func TestCoreRejectsARefusedCopyBeforeTheAck(t *testing.T) {
	c := newCore(coreConfig{Max: 50})
	deliverN(c, 3, 1)
	var got []string
	for cmd := c.next(); cmd.Kind != cmdNone; cmd = c.next() {
		got = append(got, cmd.Kind.String())
		switch cmd.Kind {
		case cmdCopy:
			c.copied(factRefused, errors.New("nacked"))
		case cmdApply:
			c.applied(make([]event.Outcome, len(cmd.Hand)), nil, nil)
		case cmdAck:
			if cmd.Tag != 3 || !cmd.Multiple {
				t.Errorf("ack %d multiple=%v, want 3 multiple", cmd.Tag, cmd.Multiple)
			}
		}
	}
	if want := "copy reject apply ack"; strings.Join(got, " ") != want {
		t.Errorf("commands %v, want %s", got, want)
	}
}

// What becomes of a dead letter's copy decides what the core does next:
// the worker only reports it.
func TestCoreCopyFacts(t *testing.T) {
	tests := []struct {
		name  string
		facts []copyFact // answered to each copy or park, in turn
		end   bool       // the session ends at the first fact
		// confirms: factAnswered comes without an error (the cut publish
		// was confirmed); else with one (nacked, or its channel gone).
		confirms bool
		want     string
	}{
		{name: "confirmed: acked as a dead letter", facts: []copyFact{factConfirmed},
			want: "copy [1]; ack 1 dead-letter; none"},
		{name: "an alarm holds the copy back: parked, then acked", facts: []copyFact{factAlarm, factParked},
			want: "copy [1]; park [1]; ack 1 dead-letter; none"},
		{name: "parking fails: waited out, then copied again", facts: []copyFact{factAlarm, factParkFailed, factConfirmed},
			want: "copy [1]; park [1]; wait; copy [1]; ack 1 dead-letter; none"},
		{name: "refused: rejected to the queue's own dead-lettering", facts: []copyFact{factRefused},
			want: "copy [1]; reject 1 dead-letter; none"},
		{name: "the session ends before the confirm: returned", facts: []copyFact{factEnded}, end: true,
			want: "copy [1]; close 1 requeue; done"},
		{name: "an alarm once the session ended: returned, not parked", facts: []copyFact{factAlarm}, end: true,
			want: "copy [1]; close 1 requeue; done"},
		{name: "an alarm cuts the wait for the confirm: parked (held for the answer), then acked", facts: []copyFact{factCut, factParked},
			want: "copy [1]; park [1]; ack 1 dead-letter; none"},
		{name: "cut, and parking fails: the answer is looked for, not published again; none yet: parked again",
			facts: []copyFact{factCut, factParkFailed, factUnanswered, factParked},
			want:  "copy [1]; park [1]; wait; copy [1] answer; park [1]; ack 1 dead-letter; none"},
		{name: "cut, parking fails, the answer is a confirm: acked", facts: []copyFact{factCut, factParkFailed, factAnswered}, confirms: true,
			want: "copy [1]; park [1]; wait; copy [1] answer; ack 1 dead-letter; none"},
		{name: "cut, parking fails, the answer is a nack: published again", facts: []copyFact{factCut, factParkFailed, factAnswered, factConfirmed},
			want: "copy [1]; park [1]; wait; copy [1] answer; copy [1]; ack 1 dead-letter; none"},
		{name: "cut, then the session ends: returned", facts: []copyFact{factCut}, end: true,
			want: "copy [1]; close 1 requeue; done"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCore(coreConfig{Max: 1})
			deliverN(c, 1, 1)
			var got []string
			facts := tt.facts
			for i := 0; i < 20; i++ {
				cmd := c.next()
				line := cmd.Kind.String()
				for _, s := range cmd.Hand {
					line += fmt.Sprintf(" [%d]", s.Tag)
				}
				if cmd.Answer {
					line += " answer"
				}
				for _, st := range cmd.Settled {
					line += fmt.Sprintf(" %d %s", st.Slot.Tag, st.Action)
				}
				got = append(got, line)
				switch cmd.Kind {
				case cmdCopy, cmdPark:
					if tt.end {
						c.end()
					}
					err := errors.New(facts[0].String())
					if facts[0] == factAnswered && tt.confirms {
						err = nil
					}
					c.copied(facts[0], err)
					facts = facts[1:]
				case cmdWait:
					c.tick()
				}
				if cmd.Kind == cmdNone || cmd.Kind == cmdDone {
					break
				}
			}
			if s := strings.Join(got, "; "); s != tt.want {
				t.Errorf("\ngot  %s\nwant %s", s, tt.want)
			}
		})
	}
}

// A consumer the broker cancelled settles nothing more, not even what
// commits after the cancel: everything goes back by the close.
func TestCoreSettlesNothingAfterTheBrokersCancel(t *testing.T) {
	c := newCore(coreConfig{Max: 50})
	deliverN(c, 3)
	if cmd := c.next(); cmd.Kind != cmdApply {
		t.Fatalf("first command %v, want apply", cmd.Kind)
	}
	c.cancel()
	c.applied(make([]event.Outcome, 3), nil, nil)
	cmd := c.next()
	if cmd.Kind != cmdClose || len(cmd.Settled) != 3 {
		t.Fatalf("after the cancel: %v settling %d, want close returning all 3", cmd.Kind, len(cmd.Settled))
	}
	if next := c.next(); next.Kind != cmdDone {
		t.Errorf("then %v, want done", next.Kind)
	}
}

// Nothing behind a panic's letter is applied before it is settled: a
// decode that panicked may not panic again, so a letter held in place (or
// returned by a close before its copy) is applied the next time, and
// anything applied behind it meanwhile would be applied before it, out of
// its account's order.
func TestCoreAppliesNothingBehindAPanicsLetter(t *testing.T) {
	panicked := event.Panicked(errors.New("panic: boom"))
	deliver := func(c *core, panics ...bool) {
		for i, p := range panics {
			s := &inHand{Tag: uint64(i + 1)}
			if c.deliver(s) {
				var err error
				if p {
					err = panicked
				}
				c.decoded(s, event.Event{ID: fmt.Sprint(i + 1)}, err)
			}
		}
	}
	t.Run("the events before it go first, and may take the blame", func(t *testing.T) {
		c := newCore(coreConfig{Max: 50})
		deliver(c, false, true, false)
		got := strings.Join(drive(c, ok), "; ")
		want := "apply [1]; ack 1 multiple=false; copy [2]; ack 2 multiple=false; apply [3]; ack 3 multiple=false; none"
		if got != want {
			t.Errorf("got  %s\nwant %s", got, want)
		}
	})
	t.Run("held in place, it holds what is behind it", func(t *testing.T) {
		c := newCore(coreConfig{Max: 50})
		c.blame = false // another panic's letter went, and nothing was applied since
		deliver(c, true, false)
		got := strings.Join(drive(c, ok), "; ")
		if !strings.HasPrefix(got, "wait; wait; wait") || strings.Contains(got, "apply") {
			t.Errorf("got %s; want the queue held on the letter, nothing applied", got)
		}
	})
}

// show is a command as the journal's tests read it.
func show(cmd command) string {
	line := cmd.Kind.String()
	for _, s := range cmd.Hand {
		line += fmt.Sprintf(" [%d]", s.Tag)
	}
	if cmd.Kind == cmdAck {
		line += fmt.Sprintf(" %d multiple=%v", cmd.Tag, cmd.Multiple)
	} else {
		for _, st := range cmd.Settled {
			line += fmt.Sprintf(" %d %s", st.Slot.Tag, st.Action)
			if st.Action == ActionRequeue {
				line += fmt.Sprintf(" (%s)", st.Class)
			}
		}
	}
	if cmd.Await != 0 {
		line += fmt.Sprintf(" await %d", cmd.Await)
	}
	return line
}

// With the journal, the core settles a delivery only once the journal
// holds the ticket of what committed it, in order, and drops what still
// waits when the shutdown timeout passes, the broker cancels the consumer
// or the channel is lost: the worker only tells it the facts.
func TestCoreSettlesOnlyWhatTheJournalHolds(t *testing.T) {
	conflict := event.Conflict(errors.New("same eventId, other content"))
	tests := []struct {
		name   string
		n      int
		poison []uint64
		steps  func(c *core, do func(string))
		want   string
	}{
		{name: "an ack waits for its ticket", n: 1,
			steps: func(c *core, do func(string)) {
				do("apply")
				c.journaling(1)
				c.applied(make([]event.Outcome, 1), nil, nil)
				do("next")
				c.journaled(1)
				do("next")
				do("next")
			},
			want: "apply [1]; none await 1; ack 1 multiple=false; none"},
		{name: "the next is applied meanwhile; a later ticket holds the earlier ones", n: 2,
			steps: func(c *core, do func(string)) {
				do("apply")
				c.journaling(1)
				c.applied(make([]event.Outcome, 1), nil, nil)
				do("apply")
				c.journaling(2)
				c.applied(make([]event.Outcome, 1), nil, nil)
				do("next")
				c.journaled(2)
				do("next")
			},
			want: "apply [1]; apply [2]; none await 1; ack 2 multiple=true"},
		{name: "in order: a letter copied behind an ack that waits waits too", n: 2, poison: []uint64{2},
			steps: func(c *core, do func(string)) {
				do("copy")
				c.copied(factConfirmed, nil)
				do("apply")
				c.journaling(1)
				c.applied(make([]event.Outcome, 1), nil, nil)
				do("next")
				c.journaled(1)
				do("next")
			},
			want: "copy [2]; apply [1]; none await 1; ack 2 multiple=true"},
		{name: "a producer conflict's commit is waited for, though the attempt failed", n: 1,
			steps: func(c *core, do func(string)) {
				do("apply")
				c.journaling(1)
				c.applied(nil, conflict, nil)
				do("copy")
				c.copied(factConfirmed, nil)
				do("next")
				c.journaled(1)
				do("next")
			},
			want: "apply [1]; copy [1]; none await 1; ack 1 multiple=false"},
		{name: "a parked letter's ack waits for its entry", n: 1, poison: []uint64{1},
			steps: func(c *core, do func(string)) {
				do("copy")
				c.copied(factAlarm, nil)
				do("park")
				c.journaling(1)
				c.copied(factParked, nil)
				do("next")
				c.journaled(1)
				do("next")
			},
			want: "copy [1]; park [1]; none await 1; ack 1 multiple=false"},
		{name: "once the session ended, the close waits for the journal", n: 2,
			steps: func(c *core, do func(string)) {
				do("apply")
				c.journaling(1)
				c.applied(make([]event.Outcome, 1), nil, nil)
				c.end()
				do("next")
				c.journaled(1)
				do("next")
				do("next")
				do("next")
			},
			want: "apply [1]; none await 1; ack 1 multiple=false; close 2 requeue (shutdown); done"},
		{name: "the shutdown timeout drops what waits: it goes back by the close", n: 2,
			steps: func(c *core, do func(string)) {
				do("apply")
				c.journaling(1)
				c.applied(make([]event.Outcome, 1), nil, nil)
				c.end()
				do("next")
				c.expired()
				do("next")
				do("next")
			},
			want: "apply [1]; none await 1; close 1 requeue (shutdown) 2 requeue (shutdown); done"},
		{name: "the broker's cancel drops what waits", n: 1,
			steps: func(c *core, do func(string)) {
				do("apply")
				c.journaling(1)
				c.applied(make([]event.Outcome, 1), nil, nil)
				do("next")
				c.cancel()
				c.journaled(1) // too late: nothing more is settled
				do("next")
				do("next")
			},
			want: "apply [1]; none await 1; close 1 requeue (shutdown); done"},
		{name: "a closed channel drops what waits: done, reporting it", n: 1,
			steps: func(c *core, do func(string)) {
				do("apply")
				c.journaling(1)
				c.applied(make([]event.Outcome, 1), nil, nil)
				c.channelClosed()
				do("next")
				do("next")
			},
			want: "apply [1]; done 1 requeue (shutdown); done"},
		{name: "a failed command is a closed channel: nothing more is done on it", n: 2,
			steps: func(c *core, do func(string)) {
				do("apply")
				c.journaling(1)
				c.applied(make([]event.Outcome, 1), nil, nil)
				c.journaled(1)
				do("ack")
				c.commandFailed(command{Kind: cmdAck}, errors.New("channel closed"))
				do("next")
			},
			want: "apply [1]; ack 1 multiple=false; done"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCore(coreConfig{Max: 1})
			deliverN(c, tt.n, tt.poison...)
			var got []string
			tt.steps(c, func(want string) {
				cmd := c.next()
				if want != "next" && cmd.Kind.String() != want {
					t.Fatalf("after %v: %s, want %s", got, show(cmd), want)
				}
				got = append(got, show(cmd))
			})
			if s := strings.Join(got, "; "); s != tt.want {
				t.Errorf("\ngot  %s\nwant %s", s, tt.want)
			}
		})
	}
}

// The core classifies an attempt's error with why the session had ended
// when it returned, which the worker reports as it found it.
func TestCoreClassifiesAnAttemptWithTheSessionsEnd(t *testing.T) {
	plain := errors.New("connection reset")
	tests := []struct {
		name       string
		err, ended error
		want       event.Class
	}{
		{"applied", nil, nil, ""},
		{"applied as shutdown began", nil, event.ErrShutdown, ""},
		{"unclassified, the session on", plain, nil, event.ClassUnknown},
		{"transient, the session on", event.Transient(plain), nil, event.ClassTransient},
		{"transient, cut short by shutdown", event.Transient(plain), event.ErrShutdown, event.ClassShutdown},
		{"unclassified, cut short by shutdown", plain, fmt.Errorf("stop: %w", event.ErrShutdown), event.ClassShutdown},
		{"a panic as shutdown began", event.Panicked(plain), event.ErrShutdown, event.ClassShutdown},
		{"the session ended for a failure elsewhere", event.Transient(plain), context.Canceled, event.ClassTransient},
		{"poison stays poison through shutdown", event.Poison(plain), event.ErrShutdown, event.ClassPoison},
		{"a conflict stays a conflict through shutdown", event.Conflict(plain), event.ErrShutdown, event.ClassConflict},
		{"the error itself says shutdown", fmt.Errorf("apply: %w", event.ErrShutdown), nil, event.ClassShutdown},
	}
	for _, tt := range tests {
		if got := classOf(tt.err, tt.ended); got != tt.want {
			t.Errorf("%s: class %q, want %q", tt.name, got, tt.want)
		}
		// As event.ClassOf has it against a session that ended so.
		session, end := context.WithCancelCause(context.Background())
		if tt.ended != nil {
			end(tt.ended)
		}
		if got := event.ClassOf(session, tt.err); got != tt.want {
			t.Errorf("%s: event.ClassOf says %q, want %q", tt.name, got, tt.want)
		}
		end(nil)
	}
}

// What a failed command means is the core's to decide: the channel is
// gone, and a settlement that waited for the journal goes back with it,
// saying which command failed and why.
func TestCoreAFailedAckReturnsWhatWaitsSayingWhy(t *testing.T) {
	c := newCore(coreConfig{Max: 1})
	deliverN(c, 2)
	for tag := uint64(1); tag <= 2; tag++ {
		if cmd := c.next(); cmd.Kind != cmdApply || cmd.Hand[0].Tag != tag {
			t.Fatalf("%s, want the apply of %d", show(cmd), tag)
		}
		c.journaling(tag)
		c.applied(make([]event.Outcome, 1), nil, nil)
	}
	c.journaled(1)
	cmd := c.next()
	if cmd.Kind != cmdAck || cmd.Tag != 1 {
		t.Fatalf("%s, want the ack of 1", show(cmd))
	}
	c.commandFailed(cmd, errors.New("channel/connection is not open"))
	done := c.next()
	if done.Kind != cmdDone || len(done.Settled) != 1 || done.Settled[0].Slot.Tag != 2 {
		t.Fatalf("%s, want done, reporting 2 gone back", show(done))
	}
	st := done.Settled[0]
	if st.Action != ActionRequeue || !strings.Contains(fmt.Sprint(st.Err), "the channel failed the ack of tag 1 (channel/connection is not open)") {
		t.Errorf("2 went back as %s: %v; want a requeue naming the failed ack and its error", st.Action, st.Err)
	}
	if next := c.next(); next.Kind != cmdDone || len(next.Settled) != 0 {
		t.Errorf("after done: %s, want done, nothing more", show(next))
	}
}

// The wait of a retry names the class of the failure that blocks the
// queue, as the core classified it: the worker reports it as it is told.
func TestCoreAWaitNamesTheClassOfWhatBlocks(t *testing.T) {
	c := newCore(coreConfig{Max: 1})
	deliverN(c, 1)
	c.next()
	c.applied(nil, event.Transient(errors.New("connection refused")), nil)
	if cmd := c.next(); cmd.Kind != cmdWait || cmd.Class != event.ClassTransient {
		t.Errorf("after a transient failure: %s class %q, want a wait of class transient", show(cmd), cmd.Class)
	}
	c.tick()
	c.next()
	c.applied(nil, errors.New("no route to host"), nil)
	if cmd := c.next(); cmd.Kind != cmdWait || cmd.Class != event.ClassUnknown {
		t.Errorf("after an unclassified failure: %s class %q, want a wait of class unknown", show(cmd), cmd.Class)
	}
}
