package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// result is one subject at one queue count.
type result struct {
	Subject      string  `json:"subject"`
	Queues       int     `json:"queues"`
	Events       int     `json:"events"`
	Seconds      float64 `json:"seconds"`
	EventsPerSec float64 `json:"events_per_sec"`
	P50ms        float64 `json:"p50_ms"`
	P99ms        float64 `json:"p99_ms"`
	// CPU seconds per 1,000 events of each process.
	CPUConsumer float64 `json:"cpu_consumer_per_1k"`
	CPUBroker   float64 `json:"cpu_broker_per_1k"`
	CPUDatabase float64 `json:"cpu_database_per_1k"`
	PeakRSSMiB  float64 `json:"consumer_peak_rss_mib"`
	// Wall-clock seconds of the whole measurement and of its set-up (vhost,
	// database, schema, topology, publishing the backlog).
	WallSeconds  float64 `json:"wall_seconds"`
	SetupSeconds float64 `json:"setup_seconds"`
	// With -callgrind: the consumer's user-space instructions per event
	// over the window, counted by valgrind (the other figures are then of
	// a process slowed many times over, not for comparing).
	InstrPerEvent float64 `json:"instructions_per_event,omitempty"`
	// With -syscalls: the consumer's system calls per event over the
	// window, counted by perf (the tracepoint raw_syscalls:sys_enter).
	SyscallsPerEvent float64 `json:"syscalls_per_event,omitempty"`
	// The database server's WAL per event over the window, from
	// pg_current_wal_lsn() at the first event and at the last.
	WALPerEvent float64 `json:"wal_bytes_per_event,omitempty"`
	// The service's events per transaction over its run, from its
	// transferconsumer_batch_size histogram (the subjects that batch).
	EventsPerTx float64 `json:"events_per_transaction,omitempty"`
	// The journal's subjects: the stream's messages per event at the end
	// of the drain, from the management API (journalMessages): how well
	// the one writer combined the lanes' writes.
	JournalMsgsPerEvent float64 `json:"journal_messages_per_event,omitempty"`
	// The subject reconciling: the periodic passes its log says it ran
	// (its "reconciled" lines), how many of them were full ones, and each
	// one's duration and the transfers it read since the cut-off.
	ReconcilePasses    int       `json:"reconcile_passes,omitempty"`
	ReconcileFull      int       `json:"reconcile_full_passes,omitempty"`
	ReconcileSeconds   []float64 `json:"reconcile_pass_seconds,omitempty"`
	ReconcileTransfers []int     `json:"reconcile_pass_transfers,omitempty"`
}

type harness struct {
	profileDir              string // where to write CPU profiles, when asked for
	callgrindDir            string // where to write callgrind counts, when asked for
	profileAddr             string
	amqpURL, mgmtURL, dbURL string
	events, accounts        int
	tmp, service, self      string
	logs                    string        // where subjects' logs go: memory when possible
	baseline                string        // another build of the service, or ""
	userID                  string        // the user_id property the backlog is published with, or ""
	syscalls                bool          // count the consumers' system calls (perf)
	batch                   int           // BATCH_MAX of the subject "batch"
	baselineBatch           int           // BATCH_MAX of the subject "baseline"
	baselineJournal         bool          // the subject "baseline" runs with the journal on
	steadyRate              int           // events/s of a steady load instead of a backlog, or 0
	reconcileEvery          time.Duration // RECONCILE_INTERVAL of the subject reconciling
	recent                  int           // transfers loaded over the last hour before each drain, or 0
	bodies                  [][]byte
	keys                    []string
}

func getenv(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// newHarness builds the service from the repository; baseline, when set, is
// another build of it, measured as the subject "baseline" to compare.
func newHarness(events, accounts int, baseline string) (*harness, error) {
	h := &harness{
		amqpURL:  getenv("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		mgmtURL:  getenv("TEST_MANAGEMENT_URL", "http://guest:guest@127.0.0.1:15672"),
		dbURL:    getenv("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		events:   events,
		accounts: accounts,
	}
	if err := h.mgmt(http.MethodGet, "/api/overview", nil); err != nil {
		return nil, fmt.Errorf("the RabbitMQ management API (TEST_MANAGEMENT_URL) does not answer: %w; "+
			"it makes a vhost per measurement: rabbitmq-plugins enable rabbitmq_management rabbitmq_consistent_hash_exchange", err)
	}
	if err := pingDB(h.dbURL); err != nil {
		return nil, fmt.Errorf("PostgreSQL (TEST_DATABASE_URL) does not answer: %w", err)
	}
	var err error
	if h.tmp, err = os.MkdirTemp("", "bench-"); err != nil {
		return nil, err
	}
	// The service's log (a line per event, about 10 MB per 40,000 events)
	// goes to memory if there is a tmpfs: on disk, its write-back would
	// compete with the database's and the broker's fsyncs, which set the
	// pace here, and slow the service's run and the next one.
	if h.logs, err = os.MkdirTemp("/dev/shm", "bench-logs-"); err != nil {
		h.logs = h.tmp
	}
	h.service = filepath.Join(h.tmp, "transferconsumer")
	build := exec.Command("go", "build", "-o", h.service, ".")
	build.Dir = ".." // the service's module, the repository root
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the service: %v\n%s", err, out)
	}
	if baseline != "" {
		if h.baseline, err = filepath.Abs(baseline); err != nil {
			return nil, err
		}
	}
	if h.self, err = os.Executable(); err != nil {
		return nil, err
	}
	for _, e := range backlog(events, accounts, seed) {
		b, _ := json.Marshal(e)
		h.bodies = append(h.bodies, b)
		h.keys = append(h.keys, e.Data.FromAccount)
	}
	return h, nil
}

func (h *harness) close() {
	os.RemoveAll(h.tmp)
	os.RemoveAll(h.logs)
}

func pingDB(url string) error {
	db, err := sql.Open("postgres", url)
	if err != nil {
		return err
	}
	defer db.Close()
	return db.Ping()
}

// httpAddr picks a free local port for the service's HTTP server, so that
// the harness knows where to ask for a profile.
func (h *harness) httpAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "127.0.0.1:0"
	}
	defer ln.Close()
	h.profileAddr = ln.Addr().String()
	return h.profileAddr
}

// profileService records the service's CPU profile, in 2-second pieces
// (base-k.pprof), until stop is closed; `go tool pprof` merges the pieces.
func (h *harness) profileService(base string, stop <-chan struct{}) {
	for k := 0; ; k++ {
		select {
		case <-stop:
			return
		default:
		}
		resp, err := http.Get("http://" + h.profileAddr + "/debug/pprof/profile?seconds=2")
		if err != nil {
			select { // not serving yet
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			k--
			continue
		}
		if resp.StatusCode == http.StatusOK {
			if f, err := os.Create(fmt.Sprintf("%s-%d.pprof", base, k)); err == nil {
				io.Copy(f, resp.Body)
				f.Close()
			}
		}
		resp.Body.Close()
	}
}

// measure runs one subject on a fresh vhost and database.
func (h *harness) measure(subject string, queues int) (result, error) {
	r := result{Subject: subject, Queues: queues, Events: h.events}
	t0 := time.Now()
	name := "bench_" + randomHex()
	// The baseline migrates its own database: its apply_event may differ.
	schemaBy := h.service
	if subject == "baseline" && h.baseline != "" {
		schemaBy = h.baseline
	}
	vhostURL, dbURL, cleanup, err := h.prepare(name, queues, schemaBy)
	defer cleanup()
	if err != nil {
		return r, err
	}
	if h.recent > 0 {
		// An hour of transfers before the drain, for every subject: what
		// a periodic pass reads for duplicate intents (RECONCILE_WINDOW),
		// beside what arrived since the pass before.
		if err := loadRecent(dbURL, h.recent, h.accounts); err != nil {
			return r, fmt.Errorf("load the last hour's transfers: %w", err)
		}
	}
	if subject == "reconciling" {
		// The checkpoint made before the drain, as a running service
		// has one: the passes in the drain are periodic ones, from it,
		// and not the full pass that makes the first.
		c := exec.Command(h.service, "reconcile", "--periodic", "--skip-dlq")
		c.Env = append(os.Environ(), "AMQP_URL="+vhostURL, "DATABASE_URL="+dbURL)
		if out, err := c.CombinedOutput(); err != nil && c.ProcessState.ExitCode() != 3 { // 3: it found something, and ran
			return r, fmt.Errorf("the first periodic pass, which makes the checkpoint: %v\n%s", err, out)
		}
	}
	if subject != "dbonly" && h.steadyRate == 0 {
		if err := h.publish(vhostURL); err != nil {
			return r, fmt.Errorf("publish the backlog: %w", err)
		}
	}
	if err := h.settle(); err != nil {
		return r, err
	}
	r.SetupSeconds = time.Since(t0).Seconds()
	db, err := sql.Open("postgres", dbURL)
	if err != nil {
		return r, err
	}
	defer db.Close()

	var cmd *exec.Cmd
	profileBase := filepath.Join(h.profileDir, fmt.Sprintf("%s-q%d", subject, queues))
	env := append(os.Environ(), "BENCH_AMQP_URL="+vhostURL, "BENCH_DATABASE_URL="+dbURL,
		fmt.Sprintf("BENCH_QUEUES=%d", queues), fmt.Sprintf("BENCH_EVENTS=%d", h.events),
		fmt.Sprintf("BENCH_ACCOUNTS=%d", h.accounts))
	switch subject {
	case "service", "baseline", "batch", "journal", "batch-journal", "reconciling":
		bin := h.service
		if subject == "baseline" {
			if h.baseline == "" {
				return r, fmt.Errorf("the baseline subject needs -baseline")
			}
			bin = h.baseline
		}
		batch := 1
		switch subject {
		case "batch", "batch-journal":
			batch = h.batch
		case "baseline":
			batch = h.baselineBatch
		}
		// The periodic reconciliation is off but in the subject
		// reconciling, which measures it: with its default of a minute,
		// a drain longer than that would carry passes in some subjects'
		// runs and not in others'.
		every := time.Duration(0)
		if subject == "reconciling" {
			every = h.reconcileEvery
		}
		cmd = exec.Command(bin)
		env = append(env, "AMQP_URL="+vhostURL, "DATABASE_URL="+dbURL, fmt.Sprintf("QUEUE_COUNT=%d", queues),
			"HTTP_ADDR="+h.httpAddr(), "INSTANCE_NAME="+name, fmt.Sprintf("BATCH_MAX=%d", batch), "RECONCILE_INTERVAL="+every.String())
		if subject == "journal" || subject == "batch-journal" || (subject == "baseline" && h.baselineJournal) {
			env = append(env, "JOURNAL_STREAM=transfers.journal") // in the run's own vhost
		}
		if h.profileDir != "" {
			env = append(env, "PPROF=true")
		}
	case "peer", "bare", "dbonly", "ackonly":
		cmd = exec.Command(h.self, subject)
		if h.profileDir != "" {
			env = append(env, "BENCH_CPUPROFILE="+profileBase+".pprof")
		}
	default:
		return r, fmt.Errorf("unknown subject %q", subject)
	}
	cgOut := ""
	if h.callgrindDir != "" && subject != "dbonly" && subject != "ackonly" {
		cmd, cgOut = h.underCallgrind(cmd, subject, queues)
		// callgrind cannot follow the preemption signal; with one P, no thread
		// spins looking for work, which under callgrind's one-thread-at-a-time
		// scheduling would add a varying count. Valgrind's emulated CPU says
		// it has RDTSCP but does not decode it where the host's CPUID hides
		// it (this machine's), and Go's clock uses it when told it is there:
		// the fenced RDTSC path is taken instead, for every subject alike.
		env = append(env, "GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off", "GOMAXPROCS=1")
	}
	cmd.Env = env
	// The subject's log goes to a file and is read after the run, so that
	// the harness takes no CPU from the subject while it is measured.
	logPath := filepath.Join(h.logs, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return r, err
	}
	defer logFile.Close()
	cmd.Stderr = logFile
	// ackonly says "first" on stdout when it acks its first event; every
	// subject but the service prints its latency summary there at the end.
	stdoutPipe, err := cmd.StdoutPipe()
	if err != nil {
		return r, err
	}
	if err := cmd.Start(); err != nil {
		return r, err
	}
	pid := cmd.Process.Pid
	firstAck := make(chan struct{})
	var stdout bytes.Buffer
	exited := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdoutPipe)
		for sc.Scan() {
			if sc.Text() == "first" {
				close(firstAck)
				continue
			}
			stdout.Write(sc.Bytes())
		}
		exited <- cmd.Wait() // only once stdout is read to its end
	}()
	if cmd.Path != h.self && h.profileDir != "" {
		stopProfile := make(chan struct{})
		defer close(stopProfile)
		go h.profileService(profileBase, stopProfile)
	}

	// A steady load starts once the subject consumes every queue.
	var steady *steadyLoad
	if h.steadyRate > 0 {
		if err := waitConsumers(vhostURL, queues, exited); err != nil {
			cmd.Process.Kill()
			return r, fmt.Errorf("%w\n%s", err, readTail(logPath))
		}
		steady = h.startSteady(vhostURL)
	}

	// The window measured runs from the first event applied (or acked) to
	// the last, so that the subjects' start-up (connecting, declaring,
	// preparing) is left out of every figure alike.
	deadline := time.Now().Add(10 * time.Minute)
	peakKiB := 0
	for started := false; !started; {
		select {
		case err := <-exited:
			return r, fmt.Errorf("exited before its first event: %v\n%s", err, readTail(logPath))
		case <-firstAck:
			started = true
		case <-time.After(2 * time.Millisecond):
			if subject != "ackonly" {
				var any bool
				if err := db.QueryRow(`SELECT EXISTS (SELECT 1 FROM processed_event)`).Scan(&any); err == nil && any {
					started = true
				}
			}
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			return r, fmt.Errorf("no event handled after 10 minutes")
		}
	}
	if cgOut != "" {
		if err := callgrindControl("-z", pid); err != nil { // count from the first event on
			cmd.Process.Kill()
			return r, err
		}
	}
	var sc *syscallCount
	if h.syscalls && subject != "dbonly" && subject != "ackonly" {
		if sc, err = countSyscalls(pid); err != nil { // from the first event on
			cmd.Process.Kill()
			return r, err
		}
	}
	begin := takeSnapshot(pid)
	var walBegin int64
	if subject != "ackonly" {
		_ = db.QueryRow(`SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint`).Scan(&walBegin)
	}

	// Done when every event is in the inbox (or, without a database, when
	// the subject has acked them all and exited). The inbox is counted less
	// often while much is left, so that counting costs the database little.
	var end snapshot
	var exitErr error
	exitedEarly := false
	for done := false; !done; {
		wait := 20 * time.Millisecond
		if subject != "ackonly" {
			var n int
			if err := db.QueryRow(`SELECT count(*) FROM processed_event`).Scan(&n); err == nil {
				if n == h.events {
					end = takeSnapshot(pid)
					var walEnd int64
					if walBegin > 0 && db.QueryRow(`SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint`).Scan(&walEnd) == nil {
						r.WALPerEvent = float64(walEnd-walBegin) / float64(h.events-1)
					}
					break
				}
				if elapsed := time.Since(begin.at); n > 1 {
					left := time.Duration(float64(elapsed) * float64(h.events-n) / float64(n))
					wait = min(max(wait, left/2), time.Second)
				}
			}
		}
		peakKiB = max(peakKiB, vmHWM(pid))
		select {
		case exitErr = <-exited:
			exitedEarly = true
			done = true
			end = takeSnapshot(0)
		case <-time.After(wait):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			return r, fmt.Errorf("not done after 10 minutes")
		}
	}
	peakKiB = max(peakKiB, vmHWM(pid))
	if strings.HasPrefix(subject, "batch") && !exitedEarly {
		r.EventsPerTx = batchMean(h.profileAddr)
	}
	if (strings.HasSuffix(subject, "journal") || (subject == "baseline" && h.baselineJournal)) && !exitedEarly && h.steadyRate == 0 {
		if n, err := h.journalMessages(name); err == nil {
			r.JournalMsgsPerEvent = float64(n) / float64(h.events)
		} else {
			fmt.Fprintf(os.Stderr, "the journal's messages: %v\n", err)
		}
	}
	if sc != nil && !exitedEarly {
		n, err := sc.stop()
		if err != nil {
			cmd.Process.Kill()
			return r, err
		}
		r.SyscallsPerEvent = float64(n) / float64(h.events-1)
	}
	if cgOut != "" && !exitedEarly {
		// The counts are dumped, then the process killed: callgrind does
		// not survive the Go runtime's signal handling on SIGTERM.
		if err := callgrindControl("-d", pid); err != nil {
			cmd.Process.Kill()
			return r, err
		}
		cmd.Process.Kill()
		<-exited
		ir, err := callgrindTotal(cgOut, pid)
		if err != nil {
			return r, err
		}
		r.InstrPerEvent = float64(ir) / float64(h.events-1)
	} else if !exitedEarly {
		cmd.Process.Signal(syscall.SIGTERM)
		exitErr = <-exited
	} else if subject != "ackonly" {
		return r, fmt.Errorf("exited before finishing: %v\n%s", exitErr, readTail(logPath))
	}
	if exitErr != nil {
		return r, fmt.Errorf("exit: %v\n%s", exitErr, readTail(logPath))
	}
	if subject == "ackonly" { // the consumer has exited: its CPU in total
		ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
		end.consumer = tv(ru.Utime) + tv(ru.Stime)
	}

	var s summary
	switch {
	case cgOut != "": // killed: no latency summary
	case steady != nil:
		if s, err = steady.latency(db); err != nil {
			return r, err
		}
	case subject == "service" || subject == "baseline" || subject == "batch" || subject == "journal" || subject == "batch-journal" ||
		subject == "reconciling":
		if s, err = serviceLatency(logPath); err != nil {
			return r, err
		}
		if subject == "reconciling" {
			if err := r.readPasses(logPath); err != nil {
				return r, err
			}
		}
	default:
		if err := json.Unmarshal(stdout.Bytes(), &s); err != nil {
			return r, fmt.Errorf("read %s's summary %q: %w", subject, stdout.String(), err)
		}
	}
	r.P50ms, r.P99ms = s.P50ms, s.P99ms

	// The rate: the events after the first over the time from the first to
	// the last, by the inbox's own timestamps (the acks' for ackonly).
	if subject == "ackonly" {
		r.Seconds = s.LastAt.Sub(s.FirstAt).Seconds()
	} else {
		var sum int64
		if err := db.QueryRow(`SELECT coalesce(sum(balance_minor), 0) FROM balance_projection`).Scan(&sum); err != nil || sum != 0 {
			return r, fmt.Errorf("end state: balances sum to %d (%v)", sum, err)
		}
		if err := db.QueryRow(`SELECT extract(epoch FROM max(processed_at) - min(processed_at))::float8
			FROM processed_event`).Scan(&r.Seconds); err != nil {
			return r, err
		}
	}
	if r.Seconds <= 0 {
		return r, fmt.Errorf("no time measured")
	}
	r.EventsPerSec = float64(h.events-1) / r.Seconds
	per1k := 1000 / float64(h.events-1)
	r.CPUConsumer = (end.consumer - begin.consumer) * per1k
	r.CPUBroker = (end.broker - begin.broker) * per1k
	r.CPUDatabase = end.database.since(begin.database) * per1k
	// Not ru_maxrss: Linux carries it over from the forking harness.
	r.PeakRSSMiB = float64(peakKiB) / 1024
	return r, nil
}

// serviceLatency reads the service's per-event log lines: duration_us runs
// from receiving the delivery to having sent the ack.
func serviceLatency(path string) (summary, error) {
	f, err := os.Open(path)
	if err != nil {
		return summary{}, err
	}
	defer f.Close()
	var d []time.Duration
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		var l struct {
			Msg string   `json:"msg"`
			Us  *int64   `json:"duration_us"`
			Ms  *float64 `json:"duration_ms"` // builds before duration_us
		}
		switch {
		case json.Unmarshal(sc.Bytes(), &l) != nil:
		case l.Msg == "reconciled": // a periodic pass's summary, not an event
		case l.Us != nil:
			d = append(d, time.Duration(*l.Us)*time.Microsecond)
		case l.Ms != nil:
			d = append(d, time.Duration(*l.Ms*float64(time.Millisecond)))
		}
	}
	return summarize(d), sc.Err()
}

// readPasses reads the service's log for its periodic passes' summaries
// ("reconciled") into r.
func (r *result) readPasses(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		var l struct {
			Msg       string  `json:"msg"`
			Pass      string  `json:"pass"`
			Transfers int     `json:"transfers"`
			Ms        float64 `json:"duration_ms"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Msg != "reconciled" {
			continue
		}
		r.ReconcilePasses++
		if l.Pass == "full" {
			r.ReconcileFull++
		}
		r.ReconcileSeconds = append(r.ReconcileSeconds, l.Ms/1000)
		r.ReconcileTransfers = append(r.ReconcileTransfers, l.Transfers)
	}
	return sc.Err()
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// vmHWM is a process's peak resident set size in KiB, 0 once it is gone.
func vmHWM(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kib, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			return kib
		}
	}
	return 0
}

func tv(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }

// prepare makes a vhost and a database, and lets the service binary bin
// create its schema and topology in them, so that every subject meets the
// same (a baseline build, the schema it was written for).
func (h *harness) prepare(name string, queues int, bin string) (string, string, func(), error) {
	cleanups := []func(){}
	cleanup := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	if err := h.mgmt(http.MethodPut, "/api/vhosts/"+name, nil); err != nil {
		return "", "", cleanup, err
	}
	cleanups = append(cleanups, func() { h.mgmt(http.MethodDelete, "/api/vhosts/"+name, nil) })
	mu, _ := url.Parse(h.mgmtURL)
	user := mu.User.Username()
	if err := h.mgmt(http.MethodPut, "/api/permissions/"+name+"/"+user,
		map[string]string{"configure": ".*", "write": ".*", "read": ".*"}); err != nil {
		return "", "", cleanup, err
	}
	au, _ := url.Parse(h.amqpURL)
	au.Path = "/" + name
	admin, err := sql.Open("postgres", h.dbURL)
	if err != nil {
		return "", "", cleanup, err
	}
	cleanups = append(cleanups, func() { admin.Close() })
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		return "", "", cleanup, err
	}
	cleanups = append(cleanups, func() { admin.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)") })
	du, _ := url.Parse(h.dbURL)
	du.Path = "/" + name
	for _, sub := range []string{"migrate", "topology"} {
		c := exec.Command(bin, sub)
		c.Env = append(os.Environ(), "AMQP_URL="+au.String(), "DATABASE_URL="+du.String(), fmt.Sprintf("QUEUE_COUNT=%d", queues))
		if out, err := c.CombinedOutput(); err != nil {
			return "", "", cleanup, fmt.Errorf("%s: %v\n%s", sub, err, out)
		}
	}
	return au.String(), du.String(), cleanup, nil
}

// settle makes every subject start from the same quiet machine: it
// checkpoints PostgreSQL (so that each run pays the same full-page writes
// after a checkpoint), then waits, up to 10 seconds, until the broker and the
// database use less than 5% of a core over 200 ms, which lets the previous
// run's clean-up and this run's publishing finish in the background.
func (h *harness) settle() error {
	admin, err := sql.Open("postgres", h.dbURL)
	if err != nil {
		return err
	}
	defer admin.Close()
	if _, err := admin.Exec("CHECKPOINT"); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	const window = 200 * time.Millisecond
	deadline := time.Now().Add(10 * time.Second)
	prev := snapshotCPU()
	for time.Now().Before(deadline) {
		time.Sleep(window)
		cur := snapshotCPU()
		busy := (cur.broker - prev.broker) + cur.database.since(prev.database)
		if busy < 0.05*window.Seconds() {
			return nil
		}
		prev = cur
	}
	fmt.Fprintln(os.Stderr, "bench: the broker and the database did not settle within 10 s; measuring anyway")
	return nil
}

// publish sends the backlog with publisher confirms, 1,000 outstanding at a
// time, before any clock starts.
func (h *harness) publish(vhostURL string) error {
	return publishConfirmed(vhostURL, "transfers", len(h.bodies), func(i int) (string, amqp.Publishing) {
		return h.keys[i], amqp.Publishing{
			DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: h.bodies[i], UserId: h.userID,
		}
	})
}

// confirmChannel connects to vhostURL and opens a channel in confirm mode.
func confirmChannel(vhostURL string) (*amqp.Connection, *amqp.Channel, error) {
	conn, err := amqp.Dial(vhostURL)
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, ch, nil
}

// journalMessages is how many messages the run's stream holds, once the
// management API's figure (refreshed every few seconds) stays the same
// across two reads two seconds apart.
func (h *harness) journalMessages(vhost string) (int, error) {
	read := func() (int, error) {
		var q struct {
			Messages int `json:"messages"`
		}
		err := h.mgmtInto(http.MethodGet, "/api/queues/"+url.PathEscape(vhost)+"/transfers.journal", nil, &q)
		return q.Messages, err
	}
	prev := -1
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
		n, err := read()
		if err != nil {
			return 0, err
		}
		if n > 0 && n == prev {
			return n, nil
		}
		prev = n
	}
	return 0, fmt.Errorf("the stream's message count did not settle (last %d)", prev)
}

// mgmt sends a request to the management API, body in JSON if not nil.
func (h *harness) mgmt(method, path string, body any) error {
	return h.mgmtInto(method, path, body, nil)
}

// mgmtInto is mgmt that decodes the answer's JSON into out, if not nil.
func (h *harness) mgmtInto(method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	u, _ := url.Parse(h.mgmtURL + path)
	pass, _ := u.User.Password()
	user := u.User.Username()
	u.User = nil
	req, _ := http.NewRequest(method, u.String(), rd)
	req.SetBasicAuth(user, pass)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	if out != nil {
		return json.NewDecoder(resp.Body).Decode(out)
	}
	return nil
}

func randomHex() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// snapshot is the CPU time spent so far by the consumer, the broker and the
// database, at a moment.
type snapshot struct {
	at       time.Time
	consumer float64
	cpu
}

// takeSnapshot reads the CPU times now; consumer stays 0 without a pid.
func takeSnapshot(pid int) snapshot {
	s := snapshot{at: time.Now(), cpu: snapshotCPU()}
	if pid != 0 {
		_, s.consumer, _ = procCPU(pid)
	}
	return s
}

func readTail(path string) []byte {
	b, _ := os.ReadFile(path)
	return tail(b, 2000)
}

// cpu is the CPU time, in seconds, of the broker and of each database process.
type cpu struct {
	broker   float64
	database pidTimes
}

type pidTimes map[int]float64

// since sums the CPU each database process spent after an earlier snapshot;
// processes that started since count in full.
func (p pidTimes) since(earlier pidTimes) float64 {
	total := 0.0
	for pid, t := range p {
		total += t - earlier[pid]
	}
	return total
}

func snapshotCPU() cpu {
	c := cpu{database: pidTimes{}}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, t, ok := procCPU(pid)
		switch {
		case !ok:
		case comm == "beam.smp":
			c.broker += t
		case comm == "postgres":
			c.database[pid] = t
		}
	}
	return c
}

// procCPU reads a process's name and its user+system CPU seconds.
func procCPU(pid int) (string, float64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", 0, false
	}
	s := string(b)
	open, closeIdx := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closeIdx < 0 {
		return "", 0, false
	}
	fields := strings.Fields(s[closeIdx+2:])
	if len(fields) < 13 {
		return "", 0, false
	}
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	const ticks = 100 // USER_HZ on Linux
	return s[open+1 : closeIdx], (utime + stime) / ticks, true
}

// syscallCount is perf counting a process's system calls.
type syscallCount struct {
	cmd *exec.Cmd
	out bytes.Buffer
}

// countSyscalls starts counting the system calls of every thread of pid.
func countSyscalls(pid int) (*syscallCount, error) {
	c := &syscallCount{cmd: exec.Command("perf", "stat", "-x,", "-e", "raw_syscalls:sys_enter", "-p", strconv.Itoa(pid))}
	c.cmd.Stderr = &c.out
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("perf stat (Debian's linux-perf, for -syscalls): %w", err)
	}
	return c, nil
}

// stop ends the count and returns it.
func (c *syscallCount) stop() (int64, error) {
	c.cmd.Process.Signal(os.Interrupt)
	c.cmd.Wait()
	for _, line := range strings.Split(c.out.String(), "\n") {
		if f := strings.Split(line, ","); len(f) > 2 && f[2] == "raw_syscalls:sys_enter" {
			return strconv.ParseInt(f[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("perf stat counted no system calls: %s", c.out.String())
}

// underCallgrind runs cmd under valgrind's callgrind, which counts the
// instructions the process executes in user space: the same count for the
// same work whatever else the machine is doing, unlike CPU time here.
func (h *harness) underCallgrind(cmd *exec.Cmd, subject string, queues int) (*exec.Cmd, string) {
	out := filepath.Join(h.callgrindDir, fmt.Sprintf("%s-q%d.%%p.out", subject, queues))
	args := append([]string{"--tool=callgrind", "--callgrind-out-file=" + out}, cmd.Args...)
	return exec.Command("valgrind", args...), out
}

func callgrindControl(flag string, pid int) error {
	out, err := exec.Command("callgrind_control", flag, strconv.Itoa(pid)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("callgrind_control %s: %v\n%s", flag, err, out)
	}
	return nil
}

// callgrindTotal reads the instruction count of the last dump of process
// pid (a dump on request is written as <file>.<n>).
func callgrindTotal(pattern string, pid int) (int64, error) {
	base := strings.Replace(pattern, "%p", strconv.Itoa(pid), 1)
	files, _ := filepath.Glob(base + ".*")
	sort.Strings(files)
	if len(files) == 0 {
		return 0, fmt.Errorf("no callgrind dump at %s.*", base)
	}
	b, err := os.ReadFile(files[len(files)-1])
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "summary: "); ok {
			return strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
		}
		if rest, ok := strings.CutPrefix(line, "totals: "); ok {
			return strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
		}
	}
	return 0, fmt.Errorf("no instruction total in %s", files[len(files)-1])
}

// batchMean reads the mean of the transferconsumer_batch_size histogram
// from the service's /metrics at addr, or 0.
func batchMean(addr string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var sum, count float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		switch f[0] {
		case "transferconsumer_batch_size_sum":
			sum, _ = strconv.ParseFloat(f[1], 64)
		case "transferconsumer_batch_size_count":
			count, _ = strconv.ParseFloat(f[1], 64)
		}
	}
	if count == 0 {
		return 0
	}
	return sum / count
}
