package integration

import (
	"fmt"
	"testing"
	"time"

	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/dlq"
	"transferconsumer/event"
)

// A rolling deploy during a database outage keeps each account's order.
// Two replicas consume the same queues (single active consumer: the first
// one is active on all of them). Transfers are created and applied; then
// the database is closed for maintenance and, for each transfer, a
// TransferCompleted and later a TransferFailed are published on its key.
// The active replica takes what its prefetch allows in hand and retries in
// place; it is stopped (its context cancelled, as SIGTERM does) while it
// holds them, and the other replica takes the queues over while the
// database is still closed. Then the database opens again. Every transfer
// must end completed: its TransferFailed came after the completion,
// contradicts it and is dead-lettered as invalid-transition. Each queue's
// transitions are laid out (lagged, below) so that, whatever the prefetch
// (1, or 50 with TEST_BATCH_MAX=50), the first messages past what the
// stopping replica holds include a TransferFailed whose TransferCompleted
// it holds: had it handed the queue over before its messages were back (a
// cancel before the return), the other replica would have applied that
// TransferFailed first, and the transfer would have ended failed.
func TestRollingDeployDuringAnOutageKeepsEachAccountsOrder(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	const queues, perQueue, transfersPerAccount = 2, 30, 5
	e.declare(queues)
	e.recordApplyOrder()
	top := e.topology(queues)

	// The transfers, created before anything consumes, on new accounts
	// until every queue has perQueue of them (a queue's depth says where
	// an account's key goes).
	byQueue := make([][]transfer, queues)
	var created []transfer
	for k := 0; ; k++ {
		enough := true
		for _, ts := range byQueue {
			enough = enough && len(ts) >= perQueue
		}
		if enough {
			break
		}
		if k == 200 {
			t.Fatalf("the keys of 200 accounts did not reach every queue: %d transfers per queue", lens(byQueue))
		}
		from := fmt.Sprintf("acc_%03d_%s", k, e.name)
		before := make([]int, queues)
		for q := range before {
			before[q] = e.ready(top.Queue(q))
		}
		var ts []transfer
		for i := 0; i < transfersPerAccount; i++ {
			ts = append(ts, newTransfer(from, fmt.Sprintf("acc_%03d_%s", (k+1+i)%7, e.name), int64(100+k+i)))
			e.publish(ts[i])
		}
		for q := range before {
			if e.ready(top.Queue(q)) > before[q] {
				byQueue[q] = append(byQueue[q], ts...)
			}
		}
		created = append(created, ts...)
	}
	const app = "tc-replica"
	a := e.startBounded(e.name+"-a", queues, db.NewInbox(e.serviceDB(app, queues+4)), nil)
	b := e.startBounded(e.name+"-b", queues, db.NewInbox(e.serviceDB(app, queues+4)), nil)
	waitFor(t, 60*time.Second, "the transfers created", func() bool { return e.inboxCount() == len(created) })
	e.waitActive(queues, func(int) string { return a.instance })
	used := map[string]bool{}
	for q := range byQueue {
		used[top.Queue(q)] = true
	}

	open := e.closeForMaintenance(app)
	var stream []transfer // in publishing order
	var contradicting []transfer
	seqs := make([][]transfer, queues)
	for q, ts := range byQueue {
		seqs[q] = lagged(ts)
	}
	for i := 0; ; i++ { // the queues' sequences, in turn
		more := false
		for q := range seqs {
			if i < len(seqs[q]) {
				ev := seqs[q][i]
				e.publish(ev)
				stream = append(stream, ev)
				if ev.EventType == event.TransferFailed {
					contradicting = append(contradicting, ev)
				}
				more = true
			}
		}
		if !more {
			break
		}
	}
	blockedOn := func(s *boundedService) func() bool {
		return func() bool {
			st := s.svc.State()
			if len(st.Blocked) != len(used) {
				return false
			}
			for _, q := range st.Blocked {
				if !used[q.Queue] {
					return false
				}
			}
			return true
		}
	}
	waitFor(t, 60*time.Second, "the active replica holding messages on every queue in use, retrying in place", blockedOn(a))
	if n := b.rec.count(); n != 0 {
		t.Fatalf("the standby replica decided %d deliveries before the deploy", n)
	}

	took, ok := a.stopWithin(30 * time.Second)
	if !ok {
		t.Fatalf("the active replica did not stop within %s of its shutdown", took)
	}
	t.Logf("the active replica stopped in %s, holding messages during the outage", took.Round(time.Millisecond))
	e.waitActive(queues, func(int) string { return b.instance })
	waitFor(t, 60*time.Second, "the new active replica holding messages while the database is closed", blockedOn(b))
	open()

	waitFor(t, 120*time.Second, "every completion applied and every failure dead-lettered", func() bool {
		return e.inboxCount() == 2*len(created) && e.ready(dlq.Queue(prefix)) == len(created)
	})
	states := map[string]int{}
	var rows []struct {
		State string `db:"state"`
		N     int    `db:"n"`
	}
	if err := e.db.Select(&rows, `SELECT state, count(*) AS n FROM transfer GROUP BY state`); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		states[r.State] = r.N
	}
	if states["completed"] != len(created) || len(states) != 1 {
		t.Errorf("transfer states %v, want all %d completed: a TransferFailed was applied before its TransferCompleted", states, len(created))
	}
	for _, c := range created {
		if s := e.transferState(c.Data.TransferID); s != "completed" {
			t.Errorf("transfer %s (account %s) is %q, want completed", c.Data.TransferID, c.Data.FromAccount, s)
		}
	}
	e.checkMoney(created) // only the creations move money: no failure was applied
	for _, ev := range stream {
		want := 1
		if ev.EventType == event.TransferFailed {
			want = 0
		}
		if got := e.inboxRows(ev.EventID); got != want {
			t.Errorf("%s %s: %d inbox rows, want %d", ev.EventType, ev.EventID, got, want)
		}
	}
	if p := e.pendingCount(); p != 0 {
		t.Errorf("%d transitions left pending", p)
	}
	letters := dlqByMessageID(e.peekDLQ())
	for _, f := range contradicting {
		ls := letters[f.EventID]
		if len(ls) != 1 || ls[0].header("x-failure-class") != "invalid-transition" {
			t.Errorf("TransferFailed %s: %d dead letters (%v), want one, invalid-transition", f.EventID, len(ls), classes(ls))
		}
	}
	e.checkAccountOrder(append(append([]transfer(nil), created...), stream...))
	for _, ev := range stream { // what the stopped replica held went back unsettled
		for _, d := range a.rec.of(ev.EventID) {
			if d.Action != consumer.ActionRequeue {
				t.Errorf("the stopped replica settled %s %s: %+v", ev.EventType, ev.EventID, d)
			}
		}
	}
}

// classes lists the dead letters' x-failure-class.
func classes(ls []dlqMessage) []any {
	var out []any
	for _, m := range ls {
		out = append(out, m.header("x-failure-class"))
	}
	return out
}

// lagged lays out the transitions of one queue's transfers c1…cn as
// C1 F1 C2 C3 F2 C4 F3 … Cn Fn-1 Fn (C a TransferCompleted, F a
// TransferFailed): each transfer's completion comes before its failure,
// position 2 is F1, and from there on every odd position is the failure of
// a transfer completed two positions before, so that the messages right
// after any prefetch of 1 or more (with at least 51 messages, for 50)
// include a failure whose completion the prefetch holds.
func lagged(cs []transfer) []transfer {
	done := func(i int) transfer { return transition(cs[i], event.TransferCompleted) }
	failed := func(i int) transfer { return transition(cs[i], event.TransferFailed) }
	out := []transfer{done(0), failed(0)}
	for k := 1; k < len(cs); k++ {
		out = append(out, done(k))
		if k >= 2 {
			out = append(out, failed(k-1))
		}
	}
	if len(cs) > 1 {
		out = append(out, failed(len(cs)-1))
	}
	return out
}

// lens returns the lengths of each of tss.
func lens(tss [][]transfer) []int {
	var out []int
	for _, ts := range tss {
		out = append(out, len(ts))
	}
	return out
}
