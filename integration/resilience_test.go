package integration

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"transferconsumer/consumer"
	"transferconsumer/db"
)

// The broker closes the service's connection (an operator in the management
// UI, a network fault) again and again: each time the service notices,
// reconnects with backoff, declares again and resumes every queue, and no
// goroutine is left behind.
func TestResumesAfterConnectionClosedFromManagementUI(t *testing.T) {
	alone(t, "counting every goroutine of the test process")
	e := newEnv(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	svc := e.start(2, nil)
	from := "acc_rc_" + e.name

	for round := 1; round <= 3; round++ {
		e.closeConnections(svc.instance)
		tr := newTransfer(from, fmt.Sprintf("acc_to%d_%s", round, e.name), int64(round))
		e.publish(tr) // waits in the queue until the service is back
		waitFor(t, 30*time.Second, fmt.Sprintf("round %d applied after the reconnect", round), func() bool {
			ds := svc.rec.of(tr.EventID)
			return len(ds) == 1 && ds[0].Action == consumer.ActionAck
		})
	}
	if got := e.balance(from); got != -6 {
		t.Errorf("balance = %d, want -6", got)
	}
	svc.stop()
}

// The whole broker application stops and starts (rabbitmqctl stop_app /
// start_app). The service keeps trying and resumes by itself.
func TestResumesAfterBrokerRestart(t *testing.T) {
	e := newEnv(t)
	ctl := rabbitmqctl(t)
	svc := e.start(2, nil)

	restartBroker(t, ctl)
	waitFor(t, 60*time.Second, "consumers back on every queue", func() bool {
		for i := 0; i < 2; i++ {
			if q, ok := e.inspect(e.topology(2).Queue(i)); !ok || q.Consumers == 0 {
				return false
			}
		}
		return true
	})
	e.openPublisher()
	tr := newTransfer("acc_br_"+e.name, "acc_bs_"+e.name, 77)
	e.publish(tr)
	waitFor(t, 30*time.Second, "the event applied after the restart", func() bool {
		ds := svc.rec.of(tr.EventID)
		return len(ds) == 1 && ds[0].Action == consumer.ActionAck
	})
	if got := e.balance(tr.Data.ToAccount); got != 77 {
		t.Errorf("balance = %d, want 77", got)
	}
}

// brokerCtl is the command that runs rabbitmqctl against the broker under
// test: TEST_RABBITMQCTL (words split on spaces, e.g. ".ci/rabbitmq4 ctl
// rabbit4"), else rabbitmqctl for a local broker. A run against containers
// has neither and skips the test, except under CI=true, where that is a
// failure.
type brokerCtl []string

func rabbitmqctl(t *testing.T) brokerCtl {
	t.Helper()
	if v := os.Getenv("TEST_RABBITMQCTL"); v != "" {
		return brokerCtl(strings.Fields(v))
	}
	path, err := exec.LookPath("rabbitmqctl")
	u, _ := url.Parse(shared.amqpURL)
	local := u.Hostname() == "127.0.0.1" || u.Hostname() == "localhost"
	if err != nil || !local {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true but the broker cannot be controlled from here (rabbitmqctl: %v, broker %s)", err, u.Host)
		}
		t.Skip("needs rabbitmqctl and a local broker")
	}
	return brokerCtl{path}
}

// run runs rabbitmqctl with args and returns its output; a failure fails
// the test.
func (c brokerCtl) run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(c[0], append(c[1:len(c):len(c)], args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func restartBroker(t *testing.T, ctl brokerCtl) {
	t.Helper()
	alone(t, "a broker restart")
	for _, args := range [][]string{{"stop_app"}, {"start_app"}, {"await_startup"}} {
		ctl.run(t, args...)
	}
	waitFor(t, 60*time.Second, "the management API", func() bool {
		req, _ := http.NewRequest(http.MethodGet, shared.managementURL+"/api/overview", nil)
		return doJSON(req, nil) == nil
	})
}

// serviceEnv is the environment of a service process consuming e's vhost
// and database. It reads the broker's state through the management API, as
// an estate would run it, unless extra names MANAGEMENT_URL(_FILE) itself.
func (e *env) serviceEnv(queues int, extra ...string) []string {
	base := []string{
		"AMQP_URL=" + e.amqpURL, "DATABASE_URL=" + e.dbURL, fmt.Sprintf("QUEUE_COUNT=%d", queues),
		fmt.Sprintf("DELIVERY_LIMIT=%d", e.limit), "HTTP_ADDR=127.0.0.1:0",
		"RETRY_MIN=20ms", "RETRY_MAX=500ms", "RECONNECT_MIN=50ms", "RECONNECT_MAX=2s",
		fmt.Sprintf("BATCH_MAX=%d", batchMax()),
	}
	if !slices.ContainsFunc(extra, func(kv string) bool { return strings.HasPrefix(kv, "MANAGEMENT_URL") }) {
		base = append(base, "MANAGEMENT_URL="+e.b.managementURL)
	}
	return append(base, extra...)
}

// SIGTERM under steady load: the service exits 0 within the timeout,
// dead-letters nothing, and a restarted service applies the rest: every
// event exactly once.
func TestSIGTERMUnderLoadLosesNothing(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(4)
	const n = 600
	events := e.publishMany(n, 8)
	proc := startProcess(t, e.serviceEnv(4, "INSTANCE_NAME="+e.name+"-a", "SHUTDOWN_TIMEOUT=10s"))
	waitFor(t, 60*time.Second, "some events applied", func() bool { return e.inboxCount() >= n/10 })

	start := time.Now()
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v, want status 0", err)
	}
	t.Logf("SIGTERM with %d of %d events applied: exited 0 in %s", e.inboxCount(), n, time.Since(start).Round(time.Millisecond))
	if c := proc.count("outcome", "dead_lettered"); c != 0 {
		t.Errorf("%d events dead-lettered during shutdown", c)
	}

	proc2 := startProcess(t, e.serviceEnv(4, "INSTANCE_NAME="+e.name+"-b"))
	waitFor(t, 90*time.Second, "every event applied", func() bool { return e.inboxCount() == n })
	proc2.stop(syscall.SIGTERM, 20*time.Second)
	e.checkExactlyOnce(events)
}

// SIGKILL at an arbitrary moment: nothing is lost or applied twice once a
// new process has finished the work.
func TestSIGKILLLosesNothing(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(4)
	const n = 600
	events := e.publishMany(n, 8)
	proc := startProcess(t, e.serviceEnv(4, "INSTANCE_NAME="+e.name+"-a"))
	waitFor(t, 60*time.Second, "some events applied", func() bool { return e.inboxCount() >= n/5 })
	proc.stop(syscall.SIGKILL, 10*time.Second)
	t.Logf("SIGKILL with %d of %d events applied", e.inboxCount(), n)

	proc2 := startProcess(t, e.serviceEnv(4, "INSTANCE_NAME="+e.name+"-b"))
	waitFor(t, 90*time.Second, "every event applied", func() bool { return e.inboxCount() == n })
	proc2.stop(syscall.SIGTERM, 20*time.Second)
	e.checkExactlyOnce(events)
}

// While the database is away, /readyz says not ready and nothing is
// dead-lettered; when it is back, readiness returns and the work is done.
func TestReadinessFollowsTheDatabase(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	u, _ := url.Parse(e.dbURL)
	p := newProxy(t, u.Host)
	u.Host = p.addr
	proc := startProcess(t, append(e.serviceEnv(2), "DATABASE_URL="+u.String()))
	proc.waitConsuming(1)
	base := proc.httpAddr()
	var body map[string]any
	waitFor(t, 20*time.Second, "ready", func() bool { return getJSON(t, base+"/readyz", &body) == 200 })

	p.down()
	events := e.publishMany(20, 4)
	waitFor(t, 20*time.Second, "not ready with the database down", func() bool {
		return getJSON(t, base+"/readyz", &body) == 503 && body["database_up"] == false
	})
	waitFor(t, 20*time.Second, "retries counted", func() bool {
		return metricSum(getText(t, base+"/metrics"), "transferconsumer_db_retries_total") > 0
	})
	p.up()
	waitFor(t, 30*time.Second, "ready again", func() bool { return getJSON(t, base+"/readyz", &body) == 200 })
	waitFor(t, 30*time.Second, "every event applied", func() bool { return e.inboxCount() == len(events) })
	proc.stop(syscall.SIGTERM, 20*time.Second)
	e.checkExactlyOnce(events)
}

// publishMany publishes n transfers among accounts accounts of this test and
// returns them.
func (e *env) publishMany(n, accounts int) []transfer {
	e.t.Helper()
	out := make([]transfer, n)
	for i := range out {
		from := fmt.Sprintf("acc_%02d_%s", i%accounts, e.name)
		to := fmt.Sprintf("acc_%02d_%s", (i*7+1)%accounts, e.name)
		if to == from {
			to = fmt.Sprintf("acc_%02d_%s", (i+1)%accounts, e.name)
		}
		out[i] = newTransfer(from, to, int64(1+i%97))
		e.publish(out[i])
	}
	return out
}

func (e *env) inboxCount() int {
	e.t.Helper()
	var n, legacy int
	if err := e.db.Get(&n, `SELECT count(*) FROM processed_event`); err != nil {
		e.t.Fatal(err)
	}
	// The inbox of before its partitions, while it is kept (sql/0012).
	var kept bool
	if err := e.db.Get(&kept, `SELECT to_regclass('processed_event_legacy') IS NOT NULL`); err != nil {
		e.t.Fatal(err)
	}
	if kept {
		if err := e.db.Get(&legacy, `SELECT count(*) FROM processed_event_legacy`); err != nil {
			e.t.Fatal(err)
		}
	}
	return n + legacy
}

// checkExactlyOnce asserts that the inbox holds exactly the given events,
// that every balance is the sum of their effects, that the balances sum to
// zero, and that nothing is left in the queues' dead-letter queue.
func (e *env) checkExactlyOnce(events []transfer) {
	e.t.Helper()
	e.checkBalances(events)
	if msgs := e.peekDLQ(); len(msgs) != 0 {
		e.t.Errorf("DLQ holds %d messages, want none", len(msgs))
	}
}

// checkBalances is checkExactlyOnce without the look at the DLQ.
func (e *env) checkBalances(events []transfer) {
	e.t.Helper()
	want := map[string]int64{}
	ids := map[string]bool{}
	for _, ev := range events {
		if ids[ev.EventID] {
			continue // a deliberate duplicate
		}
		ids[ev.EventID] = true
		want[ev.Data.FromAccount] -= ev.Data.AmountMinor
		want[ev.Data.ToAccount] += ev.Data.AmountMinor
	}
	if got := e.inboxCount(); got != len(ids) {
		e.t.Errorf("inbox holds %d events, want the %d unique ones", got, len(ids))
	}
	var rows []struct {
		Account string `db:"account"`
		Balance int64  `db:"balance_minor"`
	}
	if err := e.db.Select(&rows, `SELECT account, balance_minor FROM balance_projection`); err != nil {
		e.t.Fatal(err)
	}
	var sum int64
	wrong := []string{}
	for _, r := range rows {
		sum += r.Balance
		if r.Balance != want[r.Account] {
			wrong = append(wrong, fmt.Sprintf("%s=%d (want %d)", r.Account, r.Balance, want[r.Account]))
		}
	}
	sort.Strings(wrong)
	if len(rows) != len(want) || len(wrong) > 0 {
		e.t.Errorf("%d accounts (want %d); wrong balances: %v", len(rows), len(want), wrong)
	}
	if sum != 0 {
		e.t.Errorf("balances sum to %d, want 0", sum)
	}
}

// Retention removes exactly the expired inbox rows, in batches, while the
// consumers keep applying events; the test prints the consumers' latency
// before and during the prune.
func TestPruneOf100kExpiredRowsLeavesConsumersWorking(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	const expired = 100_000
	e.db.MustExec(`INSERT INTO processed_event (event_id, event_type, processed_at, fingerprint)
		SELECT `+prunedID+`, 'TransferCreated', now() - interval '40 days' - g * interval '1 second', '\x00'
		FROM generate_series(1, $1) g`, expired)
	e.db.MustExec(`INSERT INTO processed_event (event_id, event_type, processed_at, fingerprint)
		SELECT gen_random_uuid(), 'TransferCreated', now() - interval '29 days', '\x00'
		FROM generate_series(1, 1000)`)
	e.db.MustExec(`ANALYZE processed_event`)
	svc := e.start(4, nil)

	baseline := e.publishMany(200, 8)
	waitFor(t, 60*time.Second, "baseline applied", func() bool { return svc.rec.count() == len(baseline) })

	pruneDB, err := db.Open(context.Background(), e.dbURL, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer pruneDB.Close()
	type result struct {
		res db.PruneResult
		err error
		dur time.Duration
	}
	done := make(chan result, 1)
	pruneStart := time.Now()
	go func() {
		res, err := db.Prune(context.Background(), pruneDB, 30*24*time.Hour, 5000)
		done <- result{res, err, time.Since(pruneStart)}
	}()
	during := 0
	var pr result
	var more []transfer
publishing:
	for {
		select {
		case pr = <-done:
			break publishing
		default:
			more = append(more, e.publishMany(20, 8)...)
			during += 20
		}
	}
	waitFor(t, 60*time.Second, "everything applied", func() bool { return svc.rec.count() == len(baseline)+len(more) })

	if pr.err != nil || !pr.res.Ran || pr.res.Deleted != expired {
		t.Fatalf("prune = %+v, %v; want exactly %d rows deleted", pr.res, pr.err, expired)
	}
	if n := e.inboxCount(); n != 1000+len(baseline)+len(more) {
		t.Errorf("inbox holds %d rows, want the 1000 recent ones plus %d applied events", n, len(baseline)+len(more))
	}
	svc.rec.mu.Lock()
	all := append([]consumer.Decision(nil), svc.rec.all...)
	svc.rec.mu.Unlock()
	t.Logf("prune: %d rows in %d batches in %s; consumer latency before: %s; while pruning (%d events): %s",
		pr.res.Deleted, pr.res.Batches, pr.dur.Round(time.Millisecond),
		latency(all[:len(baseline)]), during, latency(all[len(baseline):]))
	e.db.MustExec(`DELETE FROM processed_event WHERE fingerprint = '\x00'`) // the rows inserted above
	e.checkExactlyOnce(append(baseline, more...))
}

func latency(ds []consumer.Decision) string {
	if len(ds) == 0 {
		return "no events"
	}
	d := make([]time.Duration, len(ds))
	for i := range ds {
		d[i] = ds[i].Duration
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return fmt.Sprintf("p50 %s p99 %s max %s", d[len(d)/2].Round(time.Microsecond),
		d[len(d)*99/100].Round(time.Microsecond), d[len(d)-1].Round(time.Microsecond))
}
