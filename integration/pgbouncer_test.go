package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// Behind PgBouncer, in session mode and in transaction mode (where each
// transaction may run on another server connection, and several clients
// share few), under faults: the service's attempts time out and are
// cancelled while every apply waits on a lock, its server sessions are
// terminated, and it is stopped with SIGTERM and with SIGKILL. Every event
// is applied once, in its account's order, nothing is dead-lettered, no
// queue stays blocked, retention prunes and leaves no lock behind, and none
// of the cancels reaches the query of another client of the same pooler.
func TestBehindPgBouncer(t *testing.T) {
	parallel(t)
	for _, mode := range []string{"session", "transaction"} {
		t.Run(mode, func(t *testing.T) { behindPgBouncer(t, mode) })
	}
}

func behindPgBouncer(t *testing.T, mode string) {
	e := newEnv(t)
	const queues, unique, accounts = 4, 1500, 12
	e.declare(queues)
	e.recordApplyOrder()
	// Inbox rows old enough for retention to prune through the pooler.
	e.db.MustExec(`INSERT INTO processed_event (event_id, event_type, processed_at, fingerprint)
		SELECT ` + prunedID + `, 'TransferCreated', now() - interval '800 hours', '\x00'
		FROM generate_series(1, 20)`)
	// In transaction mode, fewer server connections than the service opens
	// (QUEUE_COUNT+4): its clients take turns on them, and with the
	// bystander's. In session mode a client keeps its server connection,
	// so the pool must hold every client's (README).
	poolSize := 4
	if mode == "session" {
		poolSize = queues + 4 + 2 + 1
	}
	pooled := e.pgbouncer(mode, poolSize)

	bystander := startBystander(t, pooled)
	release := e.holdClaims()
	defer release()

	var events []transfer
	for i := 0; i < unique; i++ {
		from := fmt.Sprintf("acc_%02d_%s", i%accounts, e.name)
		to := fmt.Sprintf("acc_%02d_%s", (i*5+1)%accounts, e.name)
		if to == from {
			to = fmt.Sprintf("acc_%02d_%s", (i+1)%accounts, e.name)
		}
		events = append(events, newTransfer(from, to, int64(1+rand.IntN(500))))
		if i%10 == 9 {
			events = append(events, events[rand.IntN(len(events))])
		}
	}
	var published atomic.Int64
	pubErr := make(chan error, 1)
	go func() { pubErr <- e.publishPipelined(events, &published) }()

	dbURL := pooled + "&application_name=pgbouncer-service"
	generation := 0
	start := func() *process {
		generation++
		p := startProcess(t, e.serviceEnv(queues, fmt.Sprintf("INSTANCE_NAME=%s-g%d", e.name, generation),
			"DATABASE_URL="+dbURL, "APPLY_TIMEOUT=300ms", "PRUNE_INTERVAL=200ms", "SHUTDOWN_TIMEOUT=15s"))
		p.waitConsuming(1)
		return p
	}
	proc := start()

	// Every apply waits on the test's lock, so attempts time out and are
	// cancelled, over and over, on the pooler's shared connections.
	base := proc.httpAddr()
	waitFor(t, 30*time.Second, "attempts cancelled on the server at APPLY_TIMEOUT", func() bool {
		return proc.countAnyContaining("err", "canceling statement due to statement timeout") >= 1 &&
			metricSum(getText(t, base+"/metrics"), "transferconsumer_db_retries_total") >= 3*queues
	})
	release()

	// Each wait fails when the count stops rising for a minute, however
	// slowly it rises (waitProgress).
	const stall = time.Minute
	faults := []string{"terminate database sessions", "SIGTERM restart", "terminate database sessions", "SIGKILL restart"}
	for i, fault := range faults {
		target := (i + 1) * unique / (len(faults) + 1)
		waitProgress(t, stall, fmt.Sprintf("%d events applied", target), target, e.appliedCount)
		switch fault {
		case "terminate database sessions":
			var n int
			e.db.Get(&n, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE datname = current_database() AND application_name = 'pgbouncer-service'`)
		case "SIGTERM restart":
			if err := proc.stop(syscall.SIGTERM, 30*time.Second); err != nil {
				t.Errorf("SIGTERM: exit %v, want 0", err)
			}
			proc = start()
		case "SIGKILL restart":
			proc.stop(syscall.SIGKILL, 10*time.Second)
			proc = start()
		}
	}
	if err := <-pubErr; err != nil {
		t.Fatalf("publishing: %v", err)
	}
	waitProgress(t, stall, "every unique event applied", unique, e.appliedCount)
	waitFor(t, 30*time.Second, "the old rows pruned", func() bool { return e.inboxCount() == unique })
	waitFor(t, 30*time.Second, "the queues drained", func() bool {
		for i := 0; i < queues; i++ {
			if q, ok := e.inspect(e.topology(queues).Queue(i)); !ok || q.Messages > 0 {
				return false
			}
		}
		return true
	})
	if err := proc.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("final SIGTERM: exit %v, want 0", err)
	}

	e.checkExactlyOnce(events)
	e.checkAccountOrder(events)
	var locks int
	e.db.Get(&locks, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
	if locks != 0 {
		t.Errorf("%d advisory locks held after the service stopped, want 0", locks)
	}
	queries, cancelled := bystander.stop()
	if queries == 0 {
		t.Error("the bystander ran no query through the pooler")
	}
	if cancelled != 0 {
		t.Errorf("%d of the bystander's %d queries were cancelled: a cancel meant for the service reached another client", cancelled, queries)
	}
	t.Logf("%s mode: %d unique events and %d duplicates applied over %d processes; the bystander ran %d queries, %d cancelled",
		mode, unique, len(events)-unique, generation, queries, cancelled)
}

// countAnyContaining returns how many log lines have a key whose value
// contains sub.
func (p *process) countAnyContaining(key, sub string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, line := range p.lines {
		if v, ok := line[key]; ok && strings.Contains(fmt.Sprint(v), sub) {
			n++
		}
	}
	return n
}

// appliedCount is how many of the test's events the inbox holds (the
// apply log counts only the claims of this test's events, not the old rows
// retention removes).
func (e *env) appliedCount() int {
	var n int
	e.db.Get(&n, `SELECT count(*) FROM apply_log`)
	return n
}

// pgbouncer starts a PgBouncer of the test's own in pool mode mode, in
// front of the server of e's database, with at most poolSize server
// connections per database and user, and returns e's database URL through
// it. It is stopped at the test's end. Without the pgbouncer program the
// test skips, except with CI=true, where it fails.
func (e *env) pgbouncer(mode string, poolSize int) string {
	t := e.t
	t.Helper()
	bin := os.Getenv("TEST_PGBOUNCER")
	if bin == "" {
		bin = "pgbouncer"
		if _, err := exec.LookPath(bin); err != nil {
			bin = "/usr/sbin/pgbouncer"
		}
	}
	if _, err := exec.LookPath(bin); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true but PgBouncer is not here (TEST_PGBOUNCER, or pgbouncer on the PATH): %v", err)
		}
		t.Skipf("no PgBouncer (TEST_PGBOUNCER, or pgbouncer on the PATH): %v", err)
	}
	server, err := url.Parse(e.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(server.Host)
	if err != nil {
		t.Fatal(err)
	}
	listen := freePort(t)

	// PgBouncer will not run as root; as root, the test runs it as the
	// postgres user, which must be able to read and write its directory.
	dir, err := os.MkdirTemp("", "tc-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o777)
	user := server.User.Username()
	conf := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 500
ignore_startup_parameters = extra_float_digits
logfile = %s
`, host, port, listen, filepath.Join(dir, "users.txt"), mode, poolSize, filepath.Join(dir, "pgbouncer.log"))
	for name, content := range map[string]string{
		"pgbouncer.ini": conf,
		"users.txt":     fmt.Sprintf("%q \"\"\n", user),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{filepath.Join(dir, "pgbouncer.ini")}
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "postgres"}, args...)
	}
	cmd := exec.Command(bin, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start PgBouncer: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
			// It stopped before the test let it go: say what it said.
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			t.Errorf("PgBouncer exited during the test: %s\n%s", out.String(), lastLines(string(log), 30))
			return
		default:
		}
		cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})

	pooled := *server
	pooled.Host = fmt.Sprintf("127.0.0.1:%d", listen)
	probe, err := sqlx.Open("postgres", pooled.String())
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	waitFor(t, 20*time.Second, "PgBouncer to answer", func() bool {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			t.Fatalf("PgBouncer exited: %s\n%s", out.String(), log)
		default:
		}
		return probe.Ping() == nil
	})
	return pooled.String()
}

// bystander is another client of the same pooler, running short queries
// until it is stopped, and counting those a cancel interrupted.
type bystander struct {
	done               chan struct{}
	wg                 sync.WaitGroup
	queries, cancelled atomic.Int64
}

func startBystander(t *testing.T, dbURL string) *bystander {
	t.Helper()
	conn, err := sqlx.Open("postgres", dbURL+"&application_name=bystander")
	if err != nil {
		t.Fatal(err)
	}
	conn.SetMaxOpenConns(2)
	b := &bystander{done: make(chan struct{})}
	for range 2 {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			for {
				select {
				case <-b.done:
					return
				default:
				}
				_, err := conn.ExecContext(context.Background(), `SELECT pg_sleep(0.02)`)
				b.queries.Add(1)
				if pqErr, ok := errors.AsType[*pq.Error](err); ok && pqErr.Code == "57014" {
					b.cancelled.Add(1)
				}
			}
		}()
	}
	t.Cleanup(func() { b.stop(); conn.Close() })
	return b
}

// stop ends the bystander's queries (again: nothing) and returns how many
// ran and how many were cancelled.
func (b *bystander) stop() (queries, cancelled int64) {
	select {
	case <-b.done:
	default:
		close(b.done)
	}
	b.wg.Wait()
	return b.queries.Load(), b.cancelled.Load()
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
