package main

import (
	"bufio"
	"bytes"
	"context"
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
}

type harness struct {
	profile                 string // where to write a CPU profile of the service, at the largest queue count
	profileQueues           int
	profileAddr             string
	amqpURL, mgmtURL, dbURL string
	events, accounts        int
	tmp, service, self      string
	bodies                  [][]byte
	keys                    []string
}

func getenv(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func newHarness(events, accounts int) (*harness, error) {
	h := &harness{
		amqpURL:  getenv("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		mgmtURL:  getenv("TEST_MANAGEMENT_URL", "http://guest:guest@127.0.0.1:15672"),
		dbURL:    getenv("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		events:   events,
		accounts: accounts,
	}
	var err error
	if h.tmp, err = os.MkdirTemp("", "bench-"); err != nil {
		return nil, err
	}
	h.service = filepath.Join(h.tmp, "transferconsumer")
	build := exec.Command("go", "build", "-o", h.service, ".")
	build.Dir = ".." // the service's module, the repository root
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the service: %v\n%s", err, out)
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

func (h *harness) close() { os.RemoveAll(h.tmp) }

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

// takeProfile records 5 seconds of the service's CPU profile, once it
// serves, into h.profile.
func (h *harness) takeProfile() {
	url := "http://" + h.profileAddr + "/debug/pprof/profile?seconds=5"
	for i := 0; i < 100; i++ {
		resp, err := http.Get(url)
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		defer resp.Body.Close()
		f, err := os.Create(h.profile)
		if err == nil {
			io.Copy(f, resp.Body)
			f.Close()
		}
		return
	}
}

// measure runs one subject on a fresh vhost and database.
func (h *harness) measure(subject string, queues int) (result, error) {
	r := result{Subject: subject, Queues: queues, Events: h.events}
	name := "bench_" + randomHex()
	vhostURL, dbURL, cleanup, err := h.prepare(name, queues)
	defer cleanup()
	if err != nil {
		return r, err
	}
	if subject != "dbonly" {
		if err := h.publish(vhostURL); err != nil {
			return r, fmt.Errorf("publish the backlog: %w", err)
		}
	}
	db, err := sql.Open("postgres", dbURL)
	if err != nil {
		return r, err
	}
	defer db.Close()

	var cmd *exec.Cmd
	env := append(os.Environ(), "BENCH_AMQP_URL="+vhostURL, "BENCH_DATABASE_URL="+dbURL,
		fmt.Sprintf("BENCH_QUEUES=%d", queues), fmt.Sprintf("BENCH_EVENTS=%d", h.events),
		fmt.Sprintf("BENCH_ACCOUNTS=%d", h.accounts))
	switch subject {
	case "service":
		cmd = exec.Command(h.service)
		env = append(env, "AMQP_URL="+vhostURL, "DATABASE_URL="+dbURL, fmt.Sprintf("QUEUE_COUNT=%d", queues),
			"HTTP_ADDR="+h.httpAddr(), "INSTANCE_NAME="+name)
		if h.profile != "" && queues == h.profileQueues {
			env = append(env, "PPROF=true")
		}
	case "peer", "bare", "dbonly", "ackonly":
		cmd = exec.Command(h.self, subject)
	default:
		return r, fmt.Errorf("unknown subject %q", subject)
	}
	cmd.Env = env
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	// The subject's log goes to a file and is read after the run, so that
	// the harness takes no CPU from the subject while it is measured.
	logPath := filepath.Join(h.tmp, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return r, err
	}
	defer logFile.Close()
	cmd.Stderr = logFile

	before := snapshotCPU()
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return r, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if subject == "service" && h.profile != "" && queues == h.profileQueues {
		go h.takeProfile()
	}

	// Done when every event is in the inbox (or, without a database, when
	// the subject has acked them all and exited).
	deadline := time.Now().Add(10 * time.Minute)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var exitErr error
	exitedEarly := false
	peakKiB := 0
	for done := false; !done; {
		select {
		case exitErr = <-exited:
			exitedEarly = true
			done = true
		case <-tick.C:
			peakKiB = max(peakKiB, vmHWM(cmd.Process.Pid))
			if subject != "ackonly" {
				var n int
				if err := db.QueryRow(`SELECT count(*) FROM processed_event`).Scan(&n); err == nil && n == h.events {
					done = true
				}
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				return r, fmt.Errorf("not done after 10 minutes")
			}
		}
	}
	elapsed := time.Since(start)
	after := snapshotCPU()
	peakKiB = max(peakKiB, vmHWM(cmd.Process.Pid))
	if !exitedEarly {
		cmd.Process.Signal(syscall.SIGTERM)
		exitErr = <-exited
	} else if subject != "ackonly" {
		return r, fmt.Errorf("exited before finishing: %v", exitErr)
	}
	if exitErr != nil {
		log, _ := os.ReadFile(logPath)
		return r, fmt.Errorf("exit: %v\n%s", exitErr, tail(log, 2000))
	}
	if subject != "ackonly" {
		var sum int64
		if err := db.QueryRow(`SELECT coalesce(sum(balance_minor), 0) FROM balance_projection`).Scan(&sum); err != nil || sum != 0 {
			return r, fmt.Errorf("end state: balances sum to %d (%v)", sum, err)
		}
	}

	r.Seconds = elapsed.Seconds()
	r.EventsPerSec = float64(h.events) / r.Seconds
	var s summary
	if subject == "service" {
		if s, err = serviceLatency(logPath); err != nil {
			return r, err
		}
	} else if err := json.Unmarshal(stdout.Bytes(), &s); err != nil {
		return r, fmt.Errorf("read %s's summary %q: %w", subject, stdout.String(), err)
	}
	r.P50ms, r.P99ms = s.P50ms, s.P99ms
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	per1k := 1000 / float64(h.events)
	r.CPUConsumer = (tv(ru.Utime) + tv(ru.Stime)) * per1k
	r.CPUBroker = (after.broker - before.broker) * per1k
	r.CPUDatabase = after.database.since(before.database) * per1k
	// Not ru_maxrss: Linux carries it over from the forking harness.
	r.PeakRSSMiB = float64(peakKiB) / 1024
	return r, nil
}

// serviceLatency reads the service's per-event log lines: duration_ms runs
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
			Ms *float64 `json:"duration_ms"`
		}
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Ms != nil {
			d = append(d, time.Duration(*l.Ms*float64(time.Millisecond)))
		}
	}
	return summarize(d), sc.Err()
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

// prepare makes a vhost and a database, and lets the service binary create
// its schema and topology in them, so that every subject meets the same.
func (h *harness) prepare(name string, queues int) (string, string, func(), error) {
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
		c := exec.Command(h.service, sub)
		c.Env = append(os.Environ(), "AMQP_URL="+au.String(), "DATABASE_URL="+du.String(), fmt.Sprintf("QUEUE_COUNT=%d", queues))
		if out, err := c.CombinedOutput(); err != nil {
			return "", "", cleanup, fmt.Errorf("%s: %v\n%s", sub, err, out)
		}
	}
	return au.String(), du.String(), cleanup, nil
}

// publish sends the backlog with publisher confirms, 1,000 outstanding at a
// time, before any clock starts.
func (h *harness) publish(vhostURL string) error {
	conn, err := amqp.Dial(vhostURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	ctx := context.Background()
	var pending []*amqp.DeferredConfirmation
	flush := func() error {
		for _, dc := range pending {
			if ok, err := dc.WaitContext(ctx); err != nil || !ok {
				return fmt.Errorf("not confirmed: %v", err)
			}
		}
		pending = pending[:0]
		return nil
	}
	for i, b := range h.bodies {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "transfers", h.keys[i], false, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: b,
		})
		if err != nil {
			return err
		}
		if pending = append(pending, dc); len(pending) == 1000 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

func (h *harness) mgmt(method, path string, body any) error {
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
	return nil
}

func randomHex() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
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
