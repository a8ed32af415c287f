package integration

import (
	"fmt"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The decision core is checked against a model of a quorum queue. Each
// TestBrokerRule test pins one rule of that model on the real broker: its
// comment states the claim, and it asserts what the running version does
// (read from connection.Properties["version"]). All run on a partition
// queue declared as the service declares it: quorum, single active
// consumer, delivery limit 5, at-least-once dead-lettering to the DLQ,
// reject-publish.

// Rule: when the active consumer (prefetch 1, holding M1) is cancelled, the
// waiting consumer becomes active at once and is given the next message,
// M2, while M1 is still held; M1, returned after the cancel, goes to the
// head of the queue and so comes right after M2, before M3.
func TestBrokerRuleSACHandOverOnCancel(t *testing.T) {
	parallel(t)
	r := newRig(t)
	a := r.consume(r.dial("a"), "a", 1)
	r.publish("M1", "M2", "M3", "M4")
	m1 := a.next()
	b := r.consume(r.dial("b"), "b", 1)
	// basic.cancel is answered once the queue has applied it, hand-over
	// included: B already has M2 when it returns.
	must(t, a.ch.Cancel("a", false))
	m2 := b.next()
	must(t, m1.Nack(false, true))
	// The Nack and B's ack travel on different connections: B acks
	// only once the queue has M1 back (M1, M3, M4 ready).
	waitFor(t, patience, "M1 back in the queue", func() bool { return r.ready() == 3 })
	must(t, m2.Ack(false))
	got := append([]string{string(m2.Body)}, b.take(3)...)
	t.Logf("%s: B received %v", r.version, got)
	if want := []string{"M2", "M1", "M3", "M4"}; !slices.Equal(got, want) {
		t.Errorf("B received %v, want %v", got, want)
	}
}

// Rule: when the active consumer's channel or connection goes away without
// a cancel while it holds messages, they all go back to the head of the
// queue in their order, counted as a delivery each, and the waiting
// consumer receives them first, redelivered, before anything newer.
func TestBrokerRuleSACHandOverOnClose(t *testing.T) {
	parallel(t)
	for _, c := range []struct {
		name     string
		prefetch int
		end      func(t *testing.T, r *rig, a *sub)
	}{
		{"channel-prefetch-1", 1, func(t *testing.T, r *rig, a *sub) { must(t, a.ch.Close()) }},
		{"channel-prefetch-3", 3, func(t *testing.T, r *rig, a *sub) { must(t, a.ch.Close()) }},
		{"connection-prefetch-3", 3, func(t *testing.T, r *rig, a *sub) { must(t, a.conn.Close()) }},
		{"connection-closed-by-broker-prefetch-3", 3, func(t *testing.T, r *rig, a *sub) { r.killConnection("a") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t)
			a := r.consume(r.dial("a"), "a", c.prefetch)
			r.publish("M1", "M2", "M3", "M4", "M5")
			for range c.prefetch {
				a.next()
			}
			b := r.consume(r.dial("b"), "b", 1)
			c.end(t, r, a)
			var got []string
			for i := range 5 {
				d := b.next()
				must(t, d.Ack(false))
				got = append(got, fmt.Sprintf("%s(redelivered=%v %s)", d.Body, d.Redelivered, counts(d.Headers)))
				returned := i < c.prefetch
				dc, _ := header(d.Headers, "x-delivery-count")
				if string(d.Body) != fmt.Sprintf("M%d", i+1) || d.Redelivered != returned || (dc == 1) != returned {
					t.Errorf("B's delivery %d is %s, want M%d redelivered=%v with x-delivery-count 1: %v", i+1, got[i], i+1, returned, returned)
				}
			}
			t.Logf("%s: B received %v", r.version, got)
		})
	}
}

// Rule: a message returned to a queue with a delivery limit goes back to
// the head, in the order returned, ahead of messages never delivered,
// however it is returned.
func TestBrokerRuleReturnedMessagePosition(t *testing.T) {
	parallel(t)
	type held struct{ a, b amqp.Delivery }
	for _, c := range []struct {
		name   string
		cancel bool // cancel the holder before returning, so it gets nothing back
		give   func(t *testing.T, s *sub, h held)
		want   []string
	}{
		{"nack-a-then-b", true, func(t *testing.T, s *sub, h held) {
			must(t, h.a.Nack(false, true))
			must(t, h.b.Nack(false, true))
		}, []string{"A", "B", "C", "D"}},
		{"nack-b-then-a", true, func(t *testing.T, s *sub, h held) {
			must(t, h.b.Nack(false, true))
			must(t, h.a.Nack(false, true))
		}, []string{"B", "A", "C", "D"}},
		{"reject-a-then-b", true, func(t *testing.T, s *sub, h held) {
			must(t, h.a.Reject(true))
			must(t, h.b.Reject(true))
		}, []string{"A", "B", "C", "D"}},
		{"nack-multiple", true, func(t *testing.T, s *sub, h held) { must(t, h.b.Nack(true, true)) }, []string{"A", "B", "C", "D"}},
		{"channel-close", false, func(t *testing.T, s *sub, h held) { must(t, s.ch.Close()) }, []string{"A", "B", "C", "D"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t)
			conn := r.dial("consumer")
			first := r.consume(conn, "first", 2)
			r.publish("A", "B", "C", "D")
			h := held{first.next(), first.next()}
			if c.cancel {
				must(t, first.ch.Cancel("first", false))
			}
			c.give(t, first, h)
			// The returns travel on another channel than the next
			// consumer's: wait until the queue has applied them.
			waitFor(t, patience, "A and B back in the queue", func() bool { return r.ready() == 4 })
			got := r.consume(conn, "next", 10).take(4)
			t.Logf("%s: the next consumer received %v", r.version, got)
			if !slices.Equal(got, c.want) {
				t.Errorf("the next consumer received %v, want %v", got, c.want)
			}
		})
	}
}

// Rule: a consumer (prefetch 2) holding A and B that returns A alone gets A
// back next, before C, while it still holds B.
func TestBrokerRuleReturnedMessageComesBackBeforeNewer(t *testing.T) {
	parallel(t)
	r := newRig(t)
	s := r.consume(r.dial("consumer"), "c", 2)
	r.publish("A", "B", "C", "D")
	a, b := s.next(), s.next()
	must(t, a.Nack(false, true))
	got := s.take(3)
	must(t, b.Ack(false))
	t.Logf("%s: after returning A while holding B: %v", r.version, got)
	if want := []string{"A", "C", "D"}; !slices.Equal(got, want) {
		t.Errorf("after returning A while holding B the consumer received %v, want %v", got, want)
	}
}

// settle is one way a consumer gives a message back.
type settle struct {
	name string
	// give returns d, held by s; it may end s's channel or connection.
	give func(t *testing.T, s *sub, d amqp.Delivery)
	// fresh says the next delivery needs a new consumer: the old one's
	// channel or connection is gone.
	fresh bool
}

var settles = []settle{
	{"nack", func(t *testing.T, s *sub, d amqp.Delivery) { must(t, d.Nack(false, true)) }, false},
	{"reject", func(t *testing.T, s *sub, d amqp.Delivery) { must(t, d.Reject(true)) }, false},
	{"channel-close", func(t *testing.T, s *sub, d amqp.Delivery) { must(t, s.ch.Close()) }, true},
	{"connection-close", func(t *testing.T, s *sub, d amqp.Delivery) { must(t, s.conn.Close()) }, true},
}

// countRule is what a version does with one way of settling: whether a
// return raises x-delivery-count (and so spends the delivery limit), and
// whether deliveries after the first carry x-acquired-count, which counts
// every earlier delivery however it ended.
type countRule struct {
	counts   bool
	acquired bool
}

func deliveryCountRule(r *rig, how string) countRule {
	switch {
	case r.atLeast(4, 3):
		return countRule{counts: how != "nack", acquired: true}
	default:
		return countRule{counts: true}
	}
}

// Rule: x-delivery-count is absent on the first delivery and counts the
// returns that spend the delivery limit; with limit 5, the return after the
// sixth delivery dead-letters the message with reason delivery_limit. On
// 3.x and 4.0-4.2 every way of returning counts; from 4.3 Nack(requeue)
// does not, and x-acquired-count (absent on the first delivery, like
// x-delivery-count) counts every earlier delivery.
func TestBrokerRuleDeliveryCount(t *testing.T) {
	parallel(t)
	for _, how := range settles {
		t.Run(how.name, func(t *testing.T) {
			r := newRig(t)
			rule := deliveryCountRule(r, how.name)
			letters := r.deadLetters(r.dial("dlq"))
			r.publish("M")
			conn := r.dial("consumer-0")
			s := r.consume(conn, "c", 1)
			maxReturns := r.limit + 3 // past the limit: enough to see that a way does not count
			var seen []string
			var dead *amqp.Delivery
			for i := 0; dead == nil; i++ {
				var d amqp.Delivery
				select {
				case d = <-s.d:
				case l := <-letters:
					dead = &l
					continue
				case <-time.After(patience):
					t.Fatalf("after %d returns: neither redelivered nor dead-lettered within %s", i, patience)
				}
				seen = append(seen, counts(d.Headers))
				dc, hasDC := header(d.Headers, "x-delivery-count")
				_, hasAC := header(d.Headers, "x-acquired-count")
				switch {
				case rule.counts && i == 0 && hasDC:
					t.Errorf("first delivery has x-delivery-count %d, want none", dc)
				case rule.counts && i > 0 && dc != int64(i):
					t.Errorf("delivery %d has x-delivery-count %d, want %d", i+1, dc, i)
				case !rule.counts && dc != 0:
					t.Errorf("delivery %d has x-delivery-count %d, want none or 0 (%s does not count)", i+1, dc, how.name)
				}
				if ac, _ := header(d.Headers, "x-acquired-count"); rule.acquired && (hasAC != (i > 0) || ac != int64(i)) {
					t.Errorf("delivery %d has %s, want x-acquired-count %d (none on the first)", i+1, counts(d.Headers), i)
				} else if !rule.acquired && hasAC {
					t.Errorf("delivery %d has x-acquired-count %d, want none before 4.3", i+1, ac)
				}
				if i == maxReturns {
					must(t, d.Ack(false))
					break
				}
				how.give(t, s, d)
				if how.fresh {
					if how.name == "connection-close" {
						conn = r.dial(fmt.Sprintf("consumer-%d", i+1))
					}
					s = r.consume(conn, "c", 1)
				}
			}
			t.Logf("%s, %s: deliveries %v", r.version, how.name, seen)
			if !rule.counts {
				if dead != nil {
					t.Errorf("dead-lettered after %d deliveries; want %s never to spend the limit", len(seen), how.name)
				}
				return
			}
			if dead == nil {
				t.Fatalf("not dead-lettered after %d deliveries; want it after %d", len(seen), r.limit+1)
			}
			reason, n, first := death(dead.Headers)
			t.Logf("%s, %s: dead-lettered after %d deliveries: x-death reason %q count %d, x-first-death-reason %q, %s",
				r.version, how.name, len(seen), reason, n, first, counts(dead.Headers))
			if len(seen) != r.limit+1 || reason != "delivery_limit" || n != 1 || first != "delivery_limit" {
				t.Errorf("dead-lettered after %d deliveries with reason %q count %d first %q; want after %d with delivery_limit, 1, delivery_limit",
					len(seen), reason, n, first, r.limit+1)
			}
		})
	}
}

// timeoutRule is what a version does when a consumer holds a delivery past
// the consumer timeout.
type timeoutRule struct {
	closesChannel bool // 406 PRECONDITION_FAILED on the channel; else basic.cancel, channel open
	counts        bool // the return raises x-delivery-count
	comesBack     bool // 4.3: after the late ack the cancelled consumer is active again, unknown to the client
}

func consumerTimeoutRule(r *rig) timeoutRule {
	if r.atLeast(4, 3) {
		return timeoutRule{closesChannel: false, counts: false, comesBack: true}
	}
	return timeoutRule{closesChannel: true, counts: true}
}

// Rule: a consumer that holds a delivery past the consumer timeout loses
// it: before 4.3 the broker closes the channel (406 PRECONDITION_FAILED)
// and the return counts toward the delivery limit like any closed channel;
// from 4.3 the quorum queue cancels the consumer (basic.cancel, the AMQP
// channel stays open) and returns the message without counting it. Either
// way the held message goes back at once to the head of the queue, and the
// waiting single active consumer gets it next. A late ack of the old tag
// fails with the closed channel before 4.3; on 4.3 it is accepted and
// changes nothing for the message.
func TestBrokerRuleConsumerTimeout(t *testing.T) {
	r := newRig(t)
	opened, detect := r.consumerTimeout(2 * time.Second)
	rule := consumerTimeoutRule(r)
	a := r.consume(r.dial("a"), "a", 1)
	b := r.consume(r.dial("b"), "b", 1)
	opened()
	r.publish("M1", "M2")
	m1 := a.next()
	if string(m1.Body) != "M1" {
		t.Fatalf("the active consumer got %s first", m1.Body)
	}
	closed, cancelled := a.timedOut(detect + patience)
	t.Logf("%s: channel closed: %v; consumer cancelled: %v", r.version, closed, cancelled)
	if rule.closesChannel && (closed == nil || closed.Code != amqp.PreconditionFailed) {
		t.Errorf("want the channel closed with 406, got closed %v cancelled %v", closed, cancelled)
	}
	if !rule.closesChannel && (!cancelled || a.ch.IsClosed()) {
		t.Errorf("want the consumer cancelled and the channel open, got closed %v cancelled %v (channel closed: %v)", closed, cancelled, a.ch.IsClosed())
	}
	if cancelled {
		if _, open := <-a.d; open {
			t.Errorf("the cancelled consumer's deliveries are not closed")
		}
	}

	got := b.next()
	t.Logf("%s: the waiting consumer got %s (redelivered=%v %s)", r.version, got.Body, got.Redelivered, counts(got.Headers))
	dc, _ := header(got.Headers, "x-delivery-count")
	if string(got.Body) != "M1" || !got.Redelivered || (dc == 1) != rule.counts {
		t.Errorf("the waiting consumer got %s redelivered=%v %s; want M1, redelivered, counted %v",
			got.Body, got.Redelivered, counts(got.Headers), rule.counts)
	}

	lateAck := m1.Ack(false)
	if lateAck == nil {
		// A round trip on the same channel: an error the ack caused
		// arrives before its answer.
		_, lateAck = a.ch.QueueDeclarePassive(r.queue, true, false, false, false, nil)
	}
	t.Logf("%s: the late ack of the old tag: %v", r.version, lateAck)
	if rule.closesChannel != (lateAck != nil) {
		t.Errorf("late ack: %v; want it to fail: %v", lateAck, rule.closesChannel)
	}
	must(t, got.Ack(false))
	if rest := b.take(1); rest[0] != "M2" {
		t.Errorf("then the waiting consumer got %v, want M2", rest)
	}
}

// Rule: with no other consumer, a delivery held past the consumer timeout
// goes back to the queue. Before 4.3 the channel is closed and the
// consumer gone. From 4.3 the cancelled consumer stays registered with the
// broker (though the client has dropped it on basic.cancel): once the
// client acks the old tag, the broker makes it the active consumer again
// and hands it the message, which then sits unacked with a consumer the
// client no longer reads, blocking the queue's single active consumer,
// until that channel closes.
func TestBrokerRuleConsumerTimeoutWithNoOtherConsumer(t *testing.T) {
	r := newRig(t)
	opened, detect := r.consumerTimeout(2 * time.Second)
	rule := consumerTimeoutRule(r)
	a := r.consume(r.dial("a"), "a", 1)
	opened()
	must(t, a.ch.Confirm(false))
	r.publish("M1")
	m1 := a.next()
	closed, cancelled := a.timedOut(detect + patience)
	t.Logf("%s: channel closed: %v; consumer cancelled: %v", r.version, closed != nil, cancelled)
	// The queue counts neither a consumer the timeout cancelled nor one
	// whose channel was closed; it may learn of a closed channel a little
	// after the client does.
	waitFor(t, patience, "M1 back in the queue and no consumer counted", func() bool {
		q, err := r.pub.QueueDeclarePassive(r.queue, true, false, false, false, nil)
		must(t, err)
		return q.Messages == 1 && q.Consumers == 0
	})
	next := r.dial("next")
	if !rule.closesChannel {
		must(t, m1.Ack(false))
		// Publishing on the same channel orders the ack before the
		// publish at the queue: once M2 is confirmed, the ack has been
		// applied.
		c, err := a.ch.PublishWithDeferredConfirm("", r.queue, true, false, amqp.Publishing{Body: []byte("M2"), MessageId: "M2"})
		must(t, err)
		if !c.Wait() {
			t.Fatal("M2 refused")
		}
		ready := r.ready()
		t.Logf("%s: after the late ack and M2: %d ready", r.version, ready)
		if want := map[bool]int{true: 1, false: 2}[rule.comesBack]; ready != want {
			t.Errorf("after the late ack and M2: %d ready, want %d", ready, want)
		}
		// Another consumer gets M1 only when the forgotten one's channel
		// closes.
		must(t, a.ch.Close())
	}
	s := r.consume(next, "next", 1)
	got := s.next()
	t.Logf("%s: the next consumer got %s (redelivered=%v %s)", r.version, got.Body, got.Redelivered, counts(got.Headers))
	if string(got.Body) != "M1" {
		t.Errorf("the next consumer got %s, want M1", got.Body)
	}
	must(t, got.Ack(false))
}

// Rule: basic.qos sent on a channel after its consumer started does not
// change that consumer's prefetch: the quorum queue keeps the credit it was
// given at basic.consume.
func TestBrokerRulePrefetchChangeAfterConsume(t *testing.T) {
	parallel(t)
	r := newRig(t)
	s := r.consume(r.dial("consumer"), "c", 1)
	r.publish("M1", "M2", "M3", "M4", "M5")
	m1 := s.next()
	must(t, s.ch.Qos(3, 0, false))
	must(t, m1.Ack(false))
	// The delivery the ack frees room for comes from the same step of the
	// queue as any others that the new prefetch would allow: once it is
	// here, the ready count says how many the consumer holds.
	if m2 := s.next(); string(m2.Body) != "M2" {
		t.Fatalf("after M1 the consumer got %s", m2.Body)
	}
	held := 4 - r.ready()
	t.Logf("%s: prefetch 1 raised to 3 after consume: the consumer holds %d", r.version, held)
	if held != 1 {
		t.Errorf("the consumer holds %d after the prefetch was raised to 3, want 1 (unchanged)", held)
	}
}

// Rule: a waiting single active consumer on the same channel as the active
// one becomes active when the active one is cancelled, and gets the next
// message while the cancelled one still holds its own; that one, returned
// after the cancel, comes after it, as between two channels.
func TestBrokerRuleSACWaitingConsumerOnSameChannel(t *testing.T) {
	parallel(t)
	r := newRig(t)
	s := r.consume(r.dial("consumer"), "first", 1)
	first := s.d
	r.publish("M1", "M2", "M3")
	m1 := s.next()
	s.start(r.queue, "second")
	must(t, s.ch.Cancel("first", false))
	if _, open := <-first; open {
		t.Errorf("the first consumer got another delivery")
	}
	m2 := s.next()
	must(t, m1.Nack(false, true))
	must(t, m2.Ack(false))
	got := append([]string{string(m2.Body)}, s.take(2)...)
	t.Logf("%s: the second consumer on the channel got %v", r.version, got)
	if want := []string{"M2", "M1", "M3"}; !slices.Equal(got, want) {
		t.Errorf("the second consumer got %v, want %v", got, want)
	}
}
