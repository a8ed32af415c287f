package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
	"transferconsumer/event"
	"transferconsumer/reconcile"
)

// Reconciliation (adr/0007): every balance proved from the transfers, and
// what a producer and the consumer both let pass named. The tests whose
// names start with TestReconcileNames read the database only.

// reconcileReport is the part of `reconcile --json` the tests read.
type reconcileReport struct {
	Clean     bool  `json:"clean"`
	Transfers int64 `json:"transfers"`
	Drift     struct {
		Count int `json:"count"`
		Items []struct {
			Account    string `json:"account"`
			Expected   int64  `json:"expected"`
			Actual     *int64 `json:"actual"`
			Difference int64  `json:"difference"`
		} `json:"items"`
	} `json:"drift"`
	Duplicates struct {
		Count int `json:"count"`
		Items []struct {
			Transfer string `json:"transfer_id"`
			Earlier  string `json:"earlier_transfer_id"`
		} `json:"items"`
	} `json:"duplicate_intents"`
	Waiting struct {
		Count int `json:"count"`
		Items []struct {
			Transfer string `json:"transfer_id"`
			EventID  string `json:"event_id"`
		} `json:"items"`
	} `json:"waiting_transitions"`
	DeadLetters struct {
		Read    bool   `json:"read"`
		Error   string `json:"error"`
		Total   int    `json:"total"`
		Old     int    `json:"older_than_inbox_ttl"`
		Undated int    `json:"undated"`
	} `json:"dead_letters"`
}

// reconcile runs `transferconsumer reconcile args…` on e's database and
// broker, and returns its standard output and exit status.
func (e *env) reconcile(t *testing.T, args ...string) (string, int) {
	t.Helper()
	c := exec.Command(buildService(t), append([]string{"reconcile"}, args...)...)
	c.Env = append(os.Environ(), "AMQP_URL="+e.amqpURL, "DATABASE_URL="+e.dbURL)
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	err := c.Run()
	code := 0
	if exit, ok := errors.AsType[*exec.ExitError](err); ok {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("reconcile %v: %v", args, err)
	}
	if stderr.Len() > 0 {
		t.Logf("reconcile %v: stderr: %s", args, stderr.String())
	}
	return stdout.String(), code
}

// reconcileJSON runs `reconcile --json args…` and decodes its report.
func (e *env) reconcileJSON(t *testing.T, args ...string) (reconcileReport, int) {
	t.Helper()
	out, code := e.reconcile(t, append([]string{"--json"}, args...)...)
	var r reconcileReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("reconcile --json (exit %d): %v\n%s", code, err, out)
	}
	return r, code
}

// reconcileStream is lifecycleStream of transfers among accounts of e's
// own, and how many distinct events it holds. No two of its transfers
// share an intent: an intent repeats only after 997 × accounts transfers.
func (e *env) reconcileStream(transfers, accounts int) ([]transfer, int) {
	var names []string
	for i := range accounts {
		names = append(names, fmt.Sprintf("acc_%02d_%s", i, e.name))
	}
	events := lifecycleStream(transfers, names)
	unique := map[string]bool{}
	for _, ev := range events {
		unique[ev.EventID] = true
	}
	return events, len(unique)
}

// A lifecycle stream with duplicates, transitions before their creations
// and contradictions, applied by a service that is SIGKILLed halfway and
// started again: reconcile finds nothing (exit 0), and reads the DLQ, whose
// two contradictions are recent.
func TestReconcileCleanAfterLifecycleWithCrashesAndContradictions(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(2)
	events, unique := e.reconcileStream(300, 8)
	// Two contradictions, published after the events they contradict (on
	// the same queue, since the key is fromAccount): a failure of a
	// completed transfer, and a second creation of a transfer under
	// another eventId.
	var completed transfer
	for _, ev := range events {
		if ev.EventType == event.TransferCompleted {
			completed = ev
		}
	}
	again := events[0]
	again.EventID = newUUID()
	events = append(events, transition(completed, event.TransferFailed), again)

	var published atomic.Int64
	if err := e.publishPipelined(events, &published); err != nil {
		t.Fatal(err)
	}
	proc := startProcess(t, e.serviceEnv(2, "INSTANCE_NAME="+e.name+"-a"))
	waitFor(t, 60*time.Second, "a third applied", func() bool { return e.inboxCount() >= unique/3 })
	proc.stop(syscall.SIGKILL, 10*time.Second)
	proc = startProcess(t, e.serviceEnv(2, "INSTANCE_NAME="+e.name+"-b"))
	waitFor(t, 60*time.Second, "every event applied", func() bool { return e.inboxCount() == unique })
	waitFor(t, 30*time.Second, "the two contradictions dead-lettered", func() bool { return len(e.peekDLQ()) == 2 })
	if err := proc.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}

	r, code := e.reconcileJSON(t)
	if code != 0 || !r.Clean || r.Drift.Count+r.Duplicates.Count+r.Waiting.Count != 0 {
		t.Errorf("exit %d, report %+v; want 0 and nothing found", code, r)
	}
	if !r.DeadLetters.Read || r.DeadLetters.Total != 2 || r.DeadLetters.Old+r.DeadLetters.Undated != 0 {
		t.Errorf("dead letters %+v; want two read, none old", r.DeadLetters)
	}
	if r.Transfers != 300 {
		t.Errorf("%d transfers read, want 300", r.Transfers)
	}
	out, code := e.reconcile(t)
	if code != 0 || !strings.Contains(out, "ok: each is the net of its transfers") {
		t.Errorf("exit %d:\n%s", code, out)
	}
	if msgs := e.peekDLQ(); len(msgs) != 2 {
		t.Errorf("the DLQ holds %d letters after reconcile read it, want the 2", len(msgs))
	}
}

// A balance changed behind the service's back, a balance row deleted and
// one made up: each account is named with what its transfers say, what the
// row says and the difference, and the exit status is 3.
func TestReconcileNamesABalanceChangedBehindTheServicesBack(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	a, b, c := "acc_a_"+e.name, "acc_b_"+e.name, "acc_c_"+e.name
	paid := newTransfer(a, b, 100)
	failed := newTransfer(b, c, 30)
	back := newTransfer(c, a, 5)
	for _, ev := range []transfer{paid, failed, transition(failed, event.TransferFailed),
		back, transition(back, event.TransferCompleted)} {
		if _, err := e.apply(t, ev); err != nil {
			t.Fatal(err)
		}
	}
	if r, code := e.reconcileJSON(t, "--skip-dlq"); code != 0 || !r.Clean {
		t.Fatalf("before any change: exit %d, %+v; want 0, clean", code, r)
	}

	ghost := "acc_ghost_" + e.name
	e.db.MustExec(`UPDATE balance_projection SET balance_minor = balance_minor + 50 WHERE account = $1`, b)
	e.db.MustExec(`DELETE FROM balance_projection WHERE account = $1`, c)
	e.db.MustExec(`INSERT INTO balance_projection (account, balance_minor) VALUES ($1, 7)`, ghost)

	r, code := e.reconcileJSON(t, "--skip-dlq")
	if code != 3 || r.Clean || r.Drift.Count != 3 {
		t.Fatalf("exit %d, %d in drift; want 3 and 3 accounts", code, r.Drift.Count)
	}
	type row struct {
		expected   int64
		actual     string
		difference int64
	}
	want := map[string]row{b: {100, "150", 50}, c: {-5, "none", 5}, ghost: {0, "7", 7}}
	for _, d := range r.Drift.Items {
		actual := "none"
		if d.Actual != nil {
			actual = fmt.Sprint(*d.Actual)
		}
		if got := (row{d.Expected, actual, d.Difference}); got != want[d.Account] {
			t.Errorf("%s: %+v, want %+v", d.Account, got, want[d.Account])
		}
		delete(want, d.Account)
	}
	if len(want) > 0 {
		t.Errorf("not named: %v", want)
	}
	out, code := e.reconcile(t, "--skip-dlq")
	if code != 3 || !strings.Contains(out, "3 account(s) in drift") || !strings.Contains(out, b) ||
		!strings.Contains(out, "+50") || !strings.Contains(out, "no balance row") {
		t.Errorf("exit %d, want 3, and the accounts named:\n%s", code, out)
	}
}

// Two creations of one intent under different transferIds, moments apart,
// are named; the same intent when it failed (a retry after a failure),
// created outside the window, or with another amount, is not; nor is the
// pair once a person dismissed it.
func TestReconcileNamesTwoCreationsOfOneIntent(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	a, b := "acc_a_"+e.name, "acc_b_"+e.name
	first, second := newTransfer(a, b, 700), newTransfer(a, b, 700)
	failed, old, other := newTransfer(a, b, 700), newTransfer(a, b, 700), newTransfer(a, b, 701)
	for _, ev := range []transfer{old, failed, transition(failed, event.TransferFailed), first, other, second} {
		if _, err := e.apply(t, ev); err != nil {
			t.Fatal(err)
		}
	}
	e.db.MustExec(`UPDATE transfer SET created_at = created_at - interval '2 hours' WHERE transfer_id = $1`, old.Data.TransferID)

	r, code := e.reconcileJSON(t, "--skip-dlq")
	if code != 3 || r.Duplicates.Count != 1 || len(r.Duplicates.Items) != 1 {
		t.Fatalf("exit %d, %+v; want 3 and one suspected duplicate", code, r.Duplicates)
	}
	d := r.Duplicates.Items[0]
	if d.Transfer != second.Data.TransferID || d.Earlier != first.Data.TransferID {
		t.Errorf("named %s repeating %s, want %s repeating %s", d.Transfer, d.Earlier, second.Data.TransferID, first.Data.TransferID)
	}
	if r.Drift.Count != 0 || r.Waiting.Count != 0 {
		t.Errorf("drift %d, waiting %d; want none: both creations were applied, rightly", r.Drift.Count, r.Waiting.Count)
	}
	out, _ := e.reconcile(t, "--skip-dlq")
	if !strings.Contains(out, second.Data.TransferID) || !strings.Contains(out, "1 suspected") {
		t.Errorf("the text does not name the duplicate:\n%s", out)
	}
	// A person finds the customer meant both, and dismisses it.
	e.db.MustExec(`INSERT INTO reconcile_dismissed (transfer_id, note) VALUES ($1, 'two payments, confirmed')`, second.Data.TransferID)
	if r, code := e.reconcileJSON(t, "--skip-dlq"); code != 0 || !r.Clean {
		t.Errorf("after the dismissal: exit %d, %+v; want 0, clean", code, r.Duplicates)
	}
}

// A transition that waits for a creation that never came is named once it
// has waited longer than RECONCILE_PENDING_AFTER; one that has just
// arrived is not, and a creation that comes at last clears it.
func TestReconcileNamesATransitionWaitingForACreationThatNeverCame(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	lost := newTransfer("acc_a_"+e.name, "acc_b_"+e.name, 9)
	waiting := transition(lost, event.TransferCompleted)
	fresh := transition(newTransfer("acc_a_"+e.name, "acc_b_"+e.name, 10), event.TransferFailed)
	for _, ev := range []transfer{waiting, fresh} {
		if _, err := e.apply(t, ev); err != nil {
			t.Fatal(err)
		}
	}
	e.db.MustExec(`UPDATE pending_transition SET received_at = now() - interval '2 hours' WHERE transfer_id = $1`, lost.Data.TransferID)

	r, code := e.reconcileJSON(t, "--skip-dlq")
	if code != 3 || r.Waiting.Count != 1 || len(r.Waiting.Items) != 1 ||
		r.Waiting.Items[0].Transfer != lost.Data.TransferID || r.Waiting.Items[0].EventID != waiting.EventID {
		t.Fatalf("exit %d, %+v; want 3 and the completion of %s waiting", code, r.Waiting, lost.Data.TransferID)
	}
	if _, err := e.apply(t, lost); err != nil {
		t.Fatal(err)
	}
	if r, code := e.reconcileJSON(t, "--skip-dlq"); code != 0 || !r.Clean {
		t.Errorf("after the creation came: exit %d, %+v; want 0, clean", code, r)
	}
}

// Reconciliation run again and again while the service applies a stream
// (duplicates, transitions before their creations) sees no drift: each
// pass reads one snapshot, and an event's balances and transfer row commit
// together. The service's own periodic runs, every 200 ms, see none either.
func TestReconcileSeesNoDriftWhileAStreamIsApplied(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(4)
	events, unique := e.reconcileStream(1500, 20)
	proc := startProcess(t, e.serviceEnv(4, "INSTANCE_NAME="+e.name+"-svc", "RECONCILE_INTERVAL=200ms"))
	proc.waitConsuming(1)
	var published atomic.Int64
	pubErr := make(chan error, 1)
	go func() { pubErr <- e.publishPipelined(events, &published) }()

	opts := reconcile.Options{Window: time.Hour, PendingAfter: time.Hour, Limit: 5}
	passes, during := 0, 0
	// Passes one after another, for as long as the events keep coming: a
	// loaded machine applies them slowly, a hang stops them.
	since := time.Now()
	var p poll
	for applied := 0; applied < unique; p.pause() {
		n := e.inboxCount()
		if n > applied {
			since = time.Now()
		} else if time.Since(since) > time.Minute {
			t.Fatalf("stuck at %d of %d events applied for a minute", n, unique)
		}
		applied = n
		r, err := reconcile.Full(context.Background(), e.db, opts)
		if err != nil {
			t.Fatal(err)
		}
		passes++
		if applied > 0 && applied < unique {
			during++
		}
		if r.DriftCount != 0 || r.DupCount != 0 {
			t.Fatalf("pass %d, %d events applied: drift %+v, duplicates %+v; want none", passes, applied, r.Drift, r.Duplicates)
		}
	}
	if err := <-pubErr; err != nil {
		t.Fatal(err)
	}
	if during < 3 {
		t.Errorf("only %d passes ran while the stream was being applied", during)
	}
	if _, code := e.reconcile(t); code != 0 {
		t.Errorf("reconcile after the stream: exit %d, want 0", code)
	}
	waitFor(t, 10*time.Second, "a periodic run in the service", func() bool { return proc.count("msg", "reconciled") > 0 })
	if n := proc.count("msg", "reconcile: balance drift"); n != 0 {
		t.Errorf("the service's periodic runs logged %d drifts", n)
	}
	if err := proc.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	t.Logf("%d passes, %d of them while the stream was being applied; %d periodic runs in the service",
		passes, during, proc.count("msg", "reconciled"))
}

// The service's periodic run: a drift shows in its metrics and its log
// with the account, and goes once mended; with RECONCILE_DLQ it reads the
// DLQ, and the command names a dead letter older than INBOX_TTL (exit 3).
// While another replica's run holds the lock, a run does nothing.
func TestReconcileInTheService(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	a, b := "acc_a_"+e.name, "acc_b_"+e.name
	if _, err := e.apply(t, newTransfer(a, b, 40)); err != nil {
		t.Fatal(err)
	}
	proc := startProcess(t, e.serviceEnv(2, "INSTANCE_NAME="+e.name+"-svc", "RECONCILE_INTERVAL=200ms", "RECONCILE_DLQ=true"))
	proc.waitConsuming(1)
	base := proc.httpAddr()
	metric := func(name string) float64 {
		return metricValue(getText(t, base+"/metrics"), "transferconsumer_reconcile_"+name)
	}
	waitFor(t, 20*time.Second, "a clean run with the DLQ read", func() bool {
		return metric("accounts_in_drift") == 0 && metric("old_dead_letters") == 0 && metric("last_run_end_seconds") > 0
	})

	e.db.MustExec(`UPDATE balance_projection SET balance_minor = balance_minor - 1 WHERE account = $1`, a)
	waitFor(t, 20*time.Second, "the drift in the metrics", func() bool { return metric("accounts_in_drift") == 1 })
	if got := proc.field("reconcile: balance drift", "account"); got != a {
		t.Errorf("drift logged for %q, want %s", got, a)
	}
	e.db.MustExec(`UPDATE balance_projection SET balance_minor = balance_minor + 1 WHERE account = $1`, a)
	waitFor(t, 20*time.Second, "the drift gone from the metrics", func() bool { return metric("accounts_in_drift") == 0 })

	// A dead letter that failed 800 hours ago, beyond INBOX_TTL (720h).
	old := newTransfer(a, b, 3)
	e.publishTo(dlq.Exchange(prefix), a, old.body(), old.EventID, amqp.Table{
		dlq.HeaderClass: "poison", dlq.HeaderReason: "test", dlq.HeaderFailedAt: time.Now().Add(-800 * time.Hour).UTC().Format(time.RFC3339Nano)})
	waitFor(t, 20*time.Second, "the old dead letter in the metrics", func() bool { return metric("old_dead_letters") == 1 })
	// The service's own runs read the DLQ every 200 ms: a letter one of
	// them holds while it reads is not seen by another reader. Stopped
	// first, it holds none when the command reads.
	if err := proc.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	r, code := e.reconcileJSON(t, "--require-dlq")
	if code != 3 || r.DeadLetters.Old != 1 || r.Drift.Count != 0 {
		t.Errorf("exit %d, dead letters %+v, drift %d; want 3, one old, no drift", code, r.DeadLetters, r.Drift.Count)
	}
	if msgs := e.peekDLQ(); len(msgs) != 1 {
		t.Errorf("the DLQ holds %d letters after reconcile read it, want 1", len(msgs))
	}

	// The inbox's partition maintenance holds its own lock (7301004,
	// inbox_maintain): the pass is not held back by it.
	maint := e.db.MustBegin()
	maint.MustExec(`SELECT pg_advisory_xact_lock(7301004)`)
	res, err := reconcile.Full(context.Background(), e.db, reconcile.Options{Window: time.Hour, PendingAfter: time.Hour, Exclusive: true})
	if err != nil || !res.Ran {
		t.Errorf("with inbox_maintain's lock held: ran %v, %v; want run", res.Ran, err)
	}
	maint.Rollback()

	// Another replica's run holds the lock: this one does nothing.
	tx := e.db.MustBegin()
	defer tx.Rollback()
	tx.MustExec(`SELECT pg_advisory_xact_lock(7301005)`)
	res, err = reconcile.Full(context.Background(), e.db, reconcile.Options{Window: time.Hour, PendingAfter: time.Hour, Exclusive: true})
	if err != nil || res.Ran {
		t.Errorf("with the lock held elsewhere: ran %v, %v; want not run", res.Ran, err)
	}
}
