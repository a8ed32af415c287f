package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/event"
)

// transition returns a TransferCompleted or TransferFailed of tr's transfer.
func transition(tr transfer, eventType string) transfer {
	next := tr
	next.EventID = newUUID()
	next.EventType = eventType
	return next
}

func (e *env) apply(t *testing.T, tr transfer) (event.Result, error) {
	t.Helper()
	ev, err := event.Decode(tr.body(), tr.EventID, tr.EventType)
	if err != nil {
		t.Fatalf("decode %s: %v", tr.EventType, err)
	}
	return db.NewInbox(e.db).Apply(context.Background(), ev)
}

func (e *env) transferState(id string) string {
	var s string
	e.db.Get(&s, `SELECT state FROM transfer WHERE transfer_id = $1`, id)
	return s
}

func (e *env) pendingCount() int {
	var n int
	e.db.Get(&n, `SELECT count(*) FROM pending_transition`)
	return n
}

// Every order of Created, a final transition (Completed or Failed) and a
// duplicate (of either) ends in the same state and balances, with nothing
// left pending: disorder is tolerated, not demanded away.
func TestLifecycleAllOrdersEndTheSame(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	orders := [][3]int{{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}}
	for _, final := range []string{event.TransferCompleted, event.TransferFailed} {
		for _, dupOf := range []string{"Created", "final"} {
			for _, order := range orders {
				name := fmt.Sprintf("%s/dup_of_%s/%v", final, dupOf, order)
				t.Run(name, func(t *testing.T) {
					from, to := "acc_f_"+newUUID()[:8], "acc_t_"+newUUID()[:8]
					created := newTransfer(from, to, 1234)
					last := transition(created, final)
					dup := created
					if dupOf == "final" {
						dup = last
					}
					events := [3]transfer{created, last, dup}
					for _, i := range order {
						if _, err := e.apply(t, events[i]); err != nil {
							t.Fatalf("apply %s: %v", events[i].EventType, err)
						}
					}
					wantState, wantTo := "completed", int64(1234)
					if final == event.TransferFailed {
						wantState, wantTo = "failed", 0
					}
					if s := e.transferState(created.Data.TransferID); s != wantState {
						t.Errorf("state = %q, want %q", s, wantState)
					}
					if b := e.balance(to); b != wantTo {
						t.Errorf("to balance = %d, want %d", b, wantTo)
					}
					if b := e.balance(from); b != -wantTo {
						t.Errorf("from balance = %d, want %d", b, -wantTo)
					}
					if n := e.pendingCount(); n != 0 {
						t.Errorf("%d transitions left pending", n)
					}
				})
			}
		}
	}
}

// Transitions that contradict the transfer are not applied and are classed
// as invalid transitions, whether the transfer exists yet or not.
func TestLifecycleContradictionsAreRejected(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	isTransition := func(err error) bool {
		return event.ClassOf(context.Background(), err) == event.ClassTransition
	}

	// completed, then failed: the failure is refused and nothing is reversed.
	tr := newTransfer("acc_c1_"+e.name, "acc_c2_"+e.name, 50)
	for _, ev := range []transfer{tr, transition(tr, event.TransferCompleted)} {
		if _, err := e.apply(t, ev); err != nil {
			t.Fatal(err)
		}
	}
	failed := transition(tr, event.TransferFailed)
	if _, err := e.apply(t, failed); !isTransition(err) {
		t.Errorf("failed after completed: %v, want an invalid transition", err)
	}
	if e.transferState(tr.Data.TransferID) != "completed" || e.balance(tr.Data.ToAccount) != 50 || e.inboxRows(failed.EventID) != 0 {
		t.Error("the refused failure changed something")
	}

	// Both final transitions before the creation: the second is refused on
	// arrival; the first is applied when the creation comes.
	tr2 := newTransfer("acc_d1_"+e.name, "acc_d2_"+e.name, 70)
	if _, err := e.apply(t, transition(tr2, event.TransferFailed)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.apply(t, transition(tr2, event.TransferCompleted)); !isTransition(err) {
		t.Errorf("completed while failed is pending: %v, want an invalid transition", err)
	}
	if _, err := e.apply(t, tr2); err != nil {
		t.Fatal(err)
	}
	if e.transferState(tr2.Data.TransferID) != "failed" || e.balance(tr2.Data.ToAccount) != 0 || e.pendingCount() != 0 {
		t.Errorf("state %q, balance %d, pending %d; want failed, 0, 0",
			e.transferState(tr2.Data.TransferID), e.balance(tr2.Data.ToAccount), e.pendingCount())
	}

	// A second creation of the same transfer under another eventId.
	again := tr
	again.EventID = newUUID()
	if _, err := e.apply(t, again); !isTransition(err) {
		t.Errorf("second creation: %v, want an invalid transition", err)
	}
	// A transition whose data does not match its transfer.
	wrong := transition(tr2, event.TransferFailed)
	wrong.Data.AmountMinor = 71
	if _, err := e.apply(t, wrong); !isTransition(err) {
		t.Errorf("mismatching amount: %v, want an invalid transition", err)
	}
}

// Through the broker: a completion published before its creation waits and
// is applied with it; a contradicting failure is dead-lettered with its own
// class.
func TestLifecycleThroughTheBroker(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	svc := e.start(2, nil)
	tr := newTransfer("acc_lb1_"+e.name, "acc_lb2_"+e.name, 300)
	completed := transition(tr, event.TransferCompleted)
	failed := transition(tr, event.TransferFailed)

	e.publish(completed)
	e.publish(tr)
	e.publish(failed)
	waitFor(t, 20*time.Second, "three decisions", func() bool { return svc.rec.count() == 3 })

	if d := svc.rec.of(failed.EventID); len(d) != 1 || d[0].Class != event.ClassTransition || d[0].Action != consumer.ActionDeadLetter {
		t.Errorf("contradicting failure: %+v, want dead-lettered as invalid-transition", d)
	}
	if s := e.transferState(tr.Data.TransferID); s != "completed" || e.balance(tr.Data.ToAccount) != 300 || e.pendingCount() != 0 {
		t.Errorf("state %q, balance %d, pending %d; want completed, 300, 0", s, e.balance(tr.Data.ToAccount), e.pendingCount())
	}
	msgs := e.peekDLQ()
	if len(msgs) != 1 || msgs[0].header("x-failure-class") != "invalid-transition" {
		t.Errorf("DLQ = %+v, want the failure as invalid-transition", msgs)
	}
}

// lifecycleStream builds n transfers among accounts with the rest of their
// lives, in publishing order: a third complete, a third fail, one transition
// in ten is published before its creation (all on the same queue, since the
// key is fromAccount), and about one event in ten is published twice.
func lifecycleStream(n int, accounts []string) []transfer {
	var out []transfer
	for i := 0; i < n; i++ {
		from := accounts[i%len(accounts)]
		to := accounts[(i*7+3)%len(accounts)]
		if to == from {
			to = accounts[(i+1)%len(accounts)]
		}
		created := newTransfer(from, to, int64(1+i%997))
		var next []transfer
		switch i % 3 {
		case 1:
			next = []transfer{transition(created, event.TransferCompleted)}
		case 2:
			next = []transfer{transition(created, event.TransferFailed)}
		}
		if len(next) == 1 && i%10 == 4 {
			out = append(out, next[0], created) // the transition first
		} else {
			out = append(append(out, created), next...)
		}
		if i%5 == 0 {
			out = append(out, out[rand.IntN(len(out))]) // a duplicate of an earlier event
		}
	}
	return out
}

// checkLifecycle asserts the end state of a stream from lifecycleStream: the
// inbox holds exactly the unique events, every balance and transfer state is
// what the events say, balances sum to zero, nothing is pending and the DLQ
// is empty.
func (e *env) checkLifecycle(events []transfer) {
	e.t.Helper()
	seen := map[string]bool{}
	balance := map[string]int64{}
	state := map[string]string{}
	for _, ev := range events {
		if seen[ev.EventID] {
			continue
		}
		seen[ev.EventID] = true
		id := ev.Data.TransferID
		switch ev.EventType {
		case event.TransferCreated:
			balance[ev.Data.FromAccount] -= ev.Data.AmountMinor
			balance[ev.Data.ToAccount] += ev.Data.AmountMinor
			if state[id] == "" {
				state[id] = "created"
			}
		case event.TransferCompleted:
			state[id] = "completed"
		case event.TransferFailed:
			state[id] = "failed"
			balance[ev.Data.FromAccount] += ev.Data.AmountMinor
			balance[ev.Data.ToAccount] -= ev.Data.AmountMinor
		}
	}
	if got := e.inboxCount(); got != len(seen) {
		e.t.Errorf("inbox holds %d events, want the %d unique ones", got, len(seen))
	}
	var sum int64
	bad := 0
	for account, want := range balance {
		got := e.balance(account)
		sum += got
		if got != want {
			bad++
			if bad <= 5 {
				e.t.Errorf("%s = %d, want %d", account, got, want)
			}
		}
	}
	if sum != 0 {
		e.t.Errorf("balances sum to %d, want 0", sum)
	}
	var states []struct {
		ID    string `db:"transfer_id"`
		State string `db:"state"`
	}
	if err := e.db.Select(&states, `SELECT transfer_id, state FROM transfer`); err != nil {
		e.t.Fatal(err)
	}
	wrong := 0
	for _, s := range states {
		if state[s.ID] != s.State {
			wrong++
		}
	}
	if len(states) != len(state) || wrong > 0 {
		e.t.Errorf("%d transfers recorded (want %d), %d in the wrong state", len(states), len(state), wrong)
	}
	if n := e.pendingCount(); n != 0 {
		e.t.Errorf("%d transitions left pending", n)
	}
	if msgs := e.peekDLQ(); len(msgs) != 0 {
		e.t.Errorf("DLQ holds %d messages, want none", len(msgs))
	}
}

// A transition whose data contradicts its transfer ends the same whatever
// the order it arrived in: not applied, no inbox row, dead-lettered as
// invalid-transition with its original body, routing key and headers, and
// counted. Before the creation it waits; the creation's transaction leaves
// its dead letter in an outbox, published after the commit.
func TestContradictingTransitionEndsTheSameInEveryOrder(t *testing.T) {
	parallel(t)
	for _, order := range []string{"after its creation", "before its creation"} {
		t.Run(order, func(t *testing.T) {
			e := newEnv(t)
			svc := e.start(2, nil)
			tr := newTransfer("acc_o1_"+e.name, "acc_o2_"+e.name, 400)
			wrong := transition(tr, event.TransferFailed)
			wrong.Data.AmountMinor = 401
			headers := amqp.Table{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
			if order == "after its creation" {
				e.publish(tr)
				e.publishMsg(wrong.Data.FromAccount, wrong.body(), wrong.EventID, headers)
			} else {
				e.publishMsg(wrong.Data.FromAccount, wrong.body(), wrong.EventID, headers)
				e.publish(tr)
			}
			waitFor(t, 20*time.Second, "the transition dead-lettered", func() bool {
				for _, d := range svc.rec.of(wrong.EventID) {
					if d.Action == consumer.ActionDeadLetter {
						return true
					}
				}
				return false
			})
			if d := svc.rec.of(wrong.EventID); d[len(d)-1].Class != event.ClassTransition {
				t.Errorf("decisions %+v, want the last dead-lettered as invalid-transition", d)
			}
			if s, b := e.transferState(tr.Data.TransferID), e.balance(tr.Data.ToAccount); s != "created" || b != 400 {
				t.Errorf("state %q, balance %d; want created, 400 (the transition not applied)", s, b)
			}
			if n, p := e.inboxRows(wrong.EventID), e.pendingCount(); n != 0 || p != 0 {
				t.Errorf("%d inbox rows and %d pending for the refused transition, want none", n, p)
			}
			var msgs []dlqMessage
			waitFor(t, 10*time.Second, "the dead letter", func() bool { msgs = e.peekDLQ(); return len(msgs) == 1 })
			m := msgs[0]
			if m.header("x-failure-class") != "invalid-transition" || m.Payload != string(wrong.body()) ||
				m.RoutingKey != wrong.Data.FromAccount || m.header("traceparent") != headers["traceparent"] ||
				m.Properties["message_id"] != wrong.EventID {
				t.Errorf("dead letter: class %v, key %q, traceparent %v, message_id %v, body %s",
					m.header("x-failure-class"), m.RoutingKey, m.header("traceparent"), m.Properties["message_id"], m.Payload)
			}
		})
	}
}

// A TransferCreated whose inbox row retention pruned long ago is a
// duplicate, not an error: the transfer row, made by this very event,
// proves it was applied.
func TestCreationRedeliveredAfterItsInboxRowWasPrunedIsADuplicate(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	tr := newTransfer("acc_p1_"+e.name, "acc_p2_"+e.name, 25)
	if _, err := e.apply(t, tr); err != nil {
		t.Fatal(err)
	}
	e.db.MustExec(`DELETE FROM processed_event WHERE event_id = $1`, tr.EventID) // as retention does
	res, err := e.apply(t, tr)
	if err != nil || !res.Duplicate {
		t.Errorf("redelivered creation after pruning: %+v, %v; want a duplicate", res, err)
	}
	if b := e.balance(tr.Data.ToAccount); b != 25 {
		t.Errorf("balance = %d, want 25", b)
	}
	// The same eventId with other data is not that event.
	other := tr
	other.Data.AmountMinor = 26
	e.db.MustExec(`DELETE FROM processed_event WHERE event_id = $1`, tr.EventID)
	if _, err := e.apply(t, other); event.ClassOf(context.Background(), err) != event.ClassTransition {
		t.Errorf("other data under the pruned eventId: %v, want an invalid transition", err)
	}
}
