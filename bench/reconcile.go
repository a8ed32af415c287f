package main

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// reconcileResult is what -reconcile measured.
type reconcileResult struct {
	Transfers, Accounts, Events, Queues int
	LoadSeconds                         float64 // generate_series and VACUUM ANALYZE of the history
	IdlePassSeconds                     []float64
	// Passes while the service drains the backlog: wall time of each
	// `reconcile --json --skip-dlq` process, and the database part its
	// report gives.
	BusyPassSeconds, BusyQuerySeconds []float64
	// The service's events/s before, during and after the passes, each
	// over the same length of time.
	RateBefore, RateDuring, RateAfter float64
	PhaseSeconds                      float64
	Load1                             string // /proc/loadavg when the run started
	// Passes that found something (exit 3): the history holds no two
	// creations of one intent and its balances are its transfers' net,
	// but a random backlog may repeat an intent.
	Unclean int
}

// runReconcileMeasure loads transfers rows of history over accounts
// accounts straight into a fresh database, times reconcile on it idle,
// then has the service drain a backlog of h.events while reconcile runs
// pass after pass in the middle third of the drain, and compares the
// service's rate in the three thirds.
func (h *harness) runReconcileMeasure(transfers, queues int, phase time.Duration, out string) error {
	load, _ := os.ReadFile("/proc/loadavg")
	res := reconcileResult{Transfers: transfers, Accounts: h.accounts, Events: h.events, Queues: queues,
		PhaseSeconds: phase.Seconds(), Load1: strings.TrimSpace(string(load))}
	name := "bench_rc_" + randomHex()
	vhostURL, dbURL, cleanup, err := h.prepare(name, queues, h.service)
	defer cleanup()
	if err != nil {
		return err
	}
	db, err := sql.Open("postgres", dbURL)
	if err != nil {
		return err
	}
	defer db.Close()
	t0 := time.Now()
	if err := loadHistory(db, transfers, h.accounts, time.Duration(transfers)*time.Second); err != nil {
		return fmt.Errorf("load the history: %w", err)
	}
	res.LoadSeconds = time.Since(t0).Seconds()
	fmt.Fprintf(os.Stderr, "loaded %d transfers over %d accounts in %.0f s\n", transfers, h.accounts, res.LoadSeconds)

	env := append(os.Environ(), "AMQP_URL="+vhostURL, "DATABASE_URL="+dbURL, fmt.Sprintf("QUEUE_COUNT=%d", queues))
	pass := func() (wall, query float64, err error) {
		start := time.Now()
		c := exec.Command(h.service, "reconcile", "--json", "--skip-dlq")
		c.Env = env
		b, err := c.Output()
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.ExitCode() == 3 {
			err = nil // a finding (a random backlog may repeat an intent): the pass ran all the same
		}
		if err != nil {
			return 0, 0, fmt.Errorf("reconcile: %v\n%s", err, b)
		}
		var r struct {
			DurationMS float64 `json:"duration_ms"`
			Clean      bool    `json:"clean"`
		}
		if err := json.Unmarshal(b, &r); err != nil {
			return 0, 0, err
		}
		if !r.Clean {
			res.Unclean++
		}
		return time.Since(start).Seconds(), r.DurationMS / 1000, nil
	}
	for range 3 {
		w, _, err := pass()
		if err != nil {
			return err
		}
		res.IdlePassSeconds = append(res.IdlePassSeconds, w)
	}
	fmt.Fprintf(os.Stderr, "idle passes: %v s\n", res.IdlePassSeconds)

	if err := h.publish(vhostURL); err != nil {
		return fmt.Errorf("publish the backlog: %w", err)
	}
	if err := h.settle(); err != nil {
		return err
	}
	svc := exec.Command(h.service)
	logFile, err := os.Create(filepath.Join(h.logs, name+".log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	svc.Stderr = logFile
	svc.Env = append(env, "HTTP_ADDR=127.0.0.1:0", "INSTANCE_NAME="+name, "BATCH_MAX=1", "RECONCILE_INTERVAL=0")
	if err := svc.Start(); err != nil {
		return err
	}
	defer func() {
		svc.Process.Signal(syscall.SIGTERM)
		svc.Wait()
	}()
	applied := func() int {
		var n int
		db.QueryRow(`SELECT count(*) FROM processed_event`).Scan(&n)
		return n
	}
	for deadline := time.Now().Add(time.Minute); applied() == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("the service applied nothing in a minute")
		}
	}
	time.Sleep(2 * time.Second) // every queue's worker under way
	measure := func(during func(until time.Time) error) (float64, error) {
		n0, start := applied(), time.Now()
		if err := during(start.Add(phase)); err != nil {
			return 0, err
		}
		n1 := applied()
		if n1 >= h.events {
			return 0, fmt.Errorf("the backlog ran out within a phase: raise -events")
		}
		return float64(n1-n0) / time.Since(start).Seconds(), nil
	}
	idle := func(until time.Time) error { time.Sleep(time.Until(until)); return nil }
	if res.RateBefore, err = measure(idle); err != nil {
		return err
	}
	if res.RateDuring, err = measure(func(until time.Time) error {
		for time.Now().Before(until) {
			w, q, err := pass()
			if err != nil {
				return err
			}
			res.BusyPassSeconds = append(res.BusyPassSeconds, w)
			res.BusyQuerySeconds = append(res.BusyQuerySeconds, q)
		}
		return nil
	}); err != nil {
		return err
	}
	if res.RateAfter, err = measure(idle); err != nil {
		return err
	}

	fmt.Printf("reconcile over %d transfers and %d accounts (load at start: %s)\n", transfers, h.accounts, res.Load1)
	fmt.Printf("  idle pass (process wall time):      median %.2f s of %v\n", medianOf(res.IdlePassSeconds), res.IdlePassSeconds)
	fmt.Printf("  pass while the service drains:      median %.2f s wall, %.2f s in the database, %d passes\n",
		medianOf(res.BusyPassSeconds), medianOf(res.BusyQuerySeconds), len(res.BusyPassSeconds))
	fmt.Printf("  service, %d queues, BATCH_MAX=1:     %.0f events/s before, %.0f during, %.0f after (%.0f s each)\n",
		queues, res.RateBefore, res.RateDuring, res.RateAfter, phase.Seconds())
	fmt.Printf("  passes that found something:        %d of %d\n", res.Unclean, len(res.IdlePassSeconds)+len(res.BusyPassSeconds))
	b, _ := json.MarshalIndent(res, "", "  ")
	return os.WriteFile(out, append(b, '\n'), 0o644)
}

// loadHistory writes transfers rows into transfer, in every state (a third
// each), over accounts accounts named as the backlog names them, spread
// evenly over the span before now, with the balances they make, as if the
// service had applied them: reconcile then finds the history consistent.
// No two rows share an intent: row i goes from account i mod accounts to
// one that depends on i div accounts too.
func loadHistory(db *sql.DB, transfers, accounts int, span time.Duration) error {
	for _, q := range []string{
		`INSERT INTO transfer (transfer_id, from_account, to_account, amount_minor, currency, state, created_event_id, created_at, updated_at)
		 SELECT gen_random_uuid(),
		        'acc_' || lpad((i % $2)::text, 5, '0'),
		        'acc_' || lpad(((i % $2 + 1 + 7 * (i / $2)) % $2)::text, 5, '0'),
		        1 + (i * 7907::bigint) % 100000, 'EUR',
		        (ARRAY['created', 'completed', 'failed'])[1 + i % 3], gen_random_uuid(),
		        now() - make_interval(secs => $3::float8 * ($1 - i) / $1), now() - make_interval(secs => $3::float8 * ($1 - i) / $1)
		 FROM generate_series(0, $1 - 1) i`,
		`INSERT INTO balance_projection (account, balance_minor)
		 SELECT account, sum(delta) FROM (
		     SELECT from_account AS account, CASE WHEN state = 'failed' THEN 0 ELSE -amount_minor END AS delta FROM transfer
		     UNION ALL
		     SELECT to_account, CASE WHEN state = 'failed' THEN 0 ELSE amount_minor END FROM transfer) m
		 GROUP BY account`,
	} {
		var args []any
		if strings.Contains(q, "$1") {
			args = []any{transfers, accounts, span.Seconds()}
		}
		if _, err := db.Exec(q, args...); err != nil {
			return err
		}
	}
	for _, table := range []string{"transfer", "balance_projection"} {
		if _, err := db.Exec("VACUUM ANALYZE " + table); err != nil {
			return err
		}
	}
	return nil
}

// loadRecent loads transfers over the last hour into the database of
// dbURL (loadHistory).
func loadRecent(dbURL string, transfers, accounts int) error {
	db, err := sql.Open("postgres", dbURL)
	if err != nil {
		return err
	}
	defer db.Close()
	return loadHistory(db, transfers, accounts, time.Hour)
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64{}, v...)
	sort.Float64s(s)
	return (s[(len(s)-1)/2] + s[len(s)/2]) / 2
}
