package main

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// restoreResult is what -restore measured of one build of the service.
type restoreResult struct {
	Build          string // "service", or "baseline" (-baseline)
	Events, Queues int
	// Each round: the database loses every event (its inbox, transfers and
	// balances emptied, the journal marks back to 0), and `recover`
	// applies them all again from the journal.
	Seconds       []float64 // each recover's wall time
	PeakRSSMiB    []float64 // each recover's peak resident memory
	EntriesPerSec float64   // h.events over the median of Seconds
}

// runRestoreMeasure has each build drain h.events with the journal on
// (BATCH_MAX 50) into a database of its own, then, rounds times, takes
// everything back from the database and times `recover`, which applies
// the whole journal again, and records its peak memory.
func (h *harness) runRestoreMeasure(queues, rounds int, out string) error {
	builds := [][2]string{{"service", h.service}}
	if h.baseline != "" {
		builds = append(builds, [2]string{"baseline", h.baseline})
	}
	var results []restoreResult
	for _, b := range builds {
		r, err := h.restoreRounds(b[0], b[1], queues, rounds)
		if err != nil {
			return fmt.Errorf("%s: %w", b[0], err)
		}
		results = append(results, r)
	}
	fmt.Printf("restore of %d events over %d queues, from the journal, by `recover` (median of %d)\n", h.events, queues, rounds)
	fmt.Printf("| build | seconds | entries/s | peak RSS MiB |\n|---|---:|---:|---:|\n")
	for _, r := range results {
		fmt.Printf("| %s | %.2f | %.0f | %.0f |\n", r.Build, medianOf(r.Seconds), r.EntriesPerSec, medianOf(r.PeakRSSMiB))
	}
	b, _ := json.MarshalIndent(results, "", "  ")
	return os.WriteFile(out, append(b, '\n'), 0o644)
}

func (h *harness) restoreRounds(build, bin string, queues, rounds int) (restoreResult, error) {
	res := restoreResult{Build: build, Events: h.events, Queues: queues}
	name := "bench_rs_" + randomHex()
	vhostURL, dbURL, cleanup, err := h.prepare(name, queues, bin)
	defer cleanup()
	if err != nil {
		return res, err
	}
	db, err := sql.Open("postgres", dbURL)
	if err != nil {
		return res, err
	}
	defer db.Close()
	if err := h.publish(vhostURL); err != nil {
		return res, fmt.Errorf("publish the backlog: %w", err)
	}
	env := append(os.Environ(), "AMQP_URL="+vhostURL, "DATABASE_URL="+dbURL, fmt.Sprintf("QUEUE_COUNT=%d", queues),
		"JOURNAL_STREAM=journal", "INSTANCE_NAME="+name)
	applied := func() int {
		var n int
		db.QueryRow(`SELECT count(*) FROM processed_event`).Scan(&n)
		return n
	}
	logFile, err := os.Create(filepath.Join(h.logs, name+".log"))
	if err != nil {
		return res, err
	}
	defer logFile.Close()
	svc := exec.Command(bin)
	svc.Stderr = logFile
	svc.Env = append(env, "HTTP_ADDR=127.0.0.1:0", "BATCH_MAX=50", "RECONCILE_INTERVAL=0")
	if err := svc.Start(); err != nil {
		return res, err
	}
	for deadline := time.Now().Add(10 * time.Minute); applied() < h.events; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			svc.Process.Kill()
			svc.Wait()
			return res, fmt.Errorf("the service applied %d of %d events in 10 minutes", applied(), h.events)
		}
	}
	svc.Process.Signal(syscall.SIGTERM)
	if err := svc.Wait(); err != nil {
		return res, fmt.Errorf("the service's exit: %w", err)
	}
	for range max(rounds, 1) {
		if _, err := db.Exec(`TRUNCATE processed_event, transfer, balance_projection; UPDATE journal_mark SET seq = 0`); err != nil {
			return res, fmt.Errorf("take the events back: %w", err)
		}
		if err := h.settle(); err != nil {
			return res, err
		}
		c := exec.Command(bin, "recover")
		c.Env = env
		var output bytes.Buffer
		c.Stdout, c.Stderr = &output, &output
		start := time.Now()
		if err := c.Start(); err != nil {
			return res, err
		}
		// The peak is read off /proc while it runs: the rusage of a child
		// started by vfork counts the parent's memory too.
		exited := make(chan error, 1)
		go func() { exited <- c.Wait() }()
		peakKiB := 0
		for running := true; running; {
			peakKiB = max(peakKiB, vmHWM(c.Process.Pid))
			select {
			case err = <-exited:
				running = false
			case <-time.After(20 * time.Millisecond):
			}
		}
		if err != nil {
			return res, fmt.Errorf("recover: %v\n%s", err, output.Bytes())
		}
		res.Seconds = append(res.Seconds, time.Since(start).Seconds())
		res.PeakRSSMiB = append(res.PeakRSSMiB, float64(peakKiB)/1024)
		if n := applied(); n != h.events {
			return res, fmt.Errorf("recover applied %d of %d events again", n, h.events)
		}
		fmt.Fprintf(os.Stderr, "%s: recover of %d events: %.2f s, peak RSS %.0f MiB\n", build, h.events,
			res.Seconds[len(res.Seconds)-1], res.PeakRSSMiB[len(res.PeakRSSMiB)-1])
	}
	res.EntriesPerSec = float64(h.events) / medianOf(res.Seconds)
	return res, nil
}
