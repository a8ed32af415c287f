// Command bench measures the service against the Go peer (Watermill), a
// bare amqp091-go + database/sql loop, and the limits of the database and
// the broker, on the same machine, data and queues, in one run. Run it from
// the repository root with `cd bench && go run .` (see BENCHMARKS.md).
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
)

const seed = 20261130

var accountsFlag = flag.Int("accounts", 10_000, "accounts the backlog spreads over")

func accountsFor() int {
	if v, err := strconv.Atoi(os.Getenv("BENCH_ACCOUNTS")); err == nil {
		return v
	}
	return *accountsFlag
}

func main() {
	if len(os.Args) > 1 {
		if path := os.Getenv("BENCH_CPUPROFILE"); path != "" {
			defer startProfile(path)()
		}
		switch os.Args[1] {
		case "bare":
			runBare()
			return
		case "peer":
			runPeer()
			return
		case "dbonly":
			runDBOnly()
			return
		case "ackonly":
			runAckOnly()
			return
		case "scale":
			runScale(os.Args[2:])
			return
		case "applycost":
			runApplyCost(os.Args[2:])
			return
		case "reconcile-scale":
			runReconcileScale(os.Args[2:])
			return
		case "replaypace":
			runReplayPace(os.Args[2:])
			return
		}
	}
	queues := flag.String("queues", "1,8,32", "queue counts to measure")
	events := flag.Int("events", 40_000, "events in each backlog")
	subjects := flag.String("subjects", "service,batch,peer,bare,dbonly,ackonly", "what to measure; the order turns by one at each queue count")
	baseline := flag.String("baseline", "", "another build of the service, measured as the subject baseline (add it to -subjects)")
	batch := flag.Int("batch", 50, "BATCH_MAX of the subject batch (the service; the subject service runs with 1)")
	baselineBatch := flag.Int("baseline-batch", 1, "BATCH_MAX of the subject baseline")
	baselineJournal := flag.Bool("baseline-journal", false, "run the subject baseline with the journal on (JOURNAL_STREAM), to weigh a change to the journal")
	recent := flag.Int("recent", 0, "before each drain, load this many transfers created over the last hour (their balances too), for every subject: the duplicate intents' RECONCILE_WINDOW a periodic pass reads, as after an hour at recent/3600 transfers/s")
	reconcileEvery := flag.Duration("reconcile-every", time.Minute, "RECONCILE_INTERVAL of the subject reconciling (the service at BATCH_MAX=1 with its periodic reconciliation on, from a checkpoint made before the drain); the service's other subjects run with it off")
	steady := flag.Int("steady", 0, "instead of draining a backlog, publish -events events at this many per second while the subject runs, and report their latency from publishing to the inbox")
	userID := flag.Bool("user-id", true, "publish with the user_id property set to the publishing user, as a producer on PRODUCERS' list does (the service then judges and stamps each delivery's producer)")
	rounds := flag.Int("rounds", 1, "measure every subject this many times at each queue count; the ratios are then of medians")
	warmup := flag.Int("warmup", 4000, "events the bare loop drains, unmeasured, before the first measurement")
	out := flag.String("out", "bench-results.json", "machine-readable results")
	svg := flag.String("svg", "bench-throughput.svg", "plot of events/s against queue count")
	callgrind := flag.String("callgrind", "", "run the consumers under valgrind's callgrind and report their user-space instructions per event, writing the counts into this directory (slow; use few events)")
	syscalls := flag.Bool("syscalls", false, "count each consumer's system calls per event with perf stat (Debian's linux-perf), from its first event to its last")
	profiles := flag.String("cpuprofile", "", "write CPU profiles of every subject into this directory (slows them: not for the table)")
	report := flag.String("report", "", "print the table and write the plot of an earlier run's results (its -out file), measuring nothing")
	reconcileRows := flag.Int("reconcile", 0, "instead, load this many transfers of history and time reconcile on it, idle and while the service drains -events at the first of -queues (reconcile.go)")
	restore := flag.Bool("restore", false, "instead, have the service drain -events with the journal on at the first of -queues, then take them all back from the database and time `recover` applying them again, -rounds times (restore.go); with -baseline, that build too")
	phase := flag.Duration("phase", 15*time.Second, "with -reconcile: how long the service's rate is measured before, during and after the passes")
	flag.Parse()
	if *report != "" {
		results, err := readJSON(*report)
		if err != nil {
			fail(err)
		}
		printTable(os.Stdout, results)
		if err := writeSVG(*svg, results); err != nil {
			fail(err)
		}
		return
	}
	var qs []int
	for _, s := range strings.Split(*queues, ",") {
		q, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || q < 1 {
			fail(fmt.Errorf("-queues: %q is not a queue count", s))
		}
		qs = append(qs, q)
	}
	h, err := newHarness(*events, accountsFor(), *baseline)
	if err != nil {
		fail(err)
	}
	h.syscalls = *syscalls
	if u, err := url.Parse(h.amqpURL); err == nil && *userID {
		h.userID = u.User.Username() // the broker refuses any other
	}
	if *reconcileRows > 0 {
		defer h.close()
		if *out == "bench-results.json" {
			*out = "bench-reconcile.json"
		}
		if err := h.runReconcileMeasure(*reconcileRows, qs[0], *phase, *out); err != nil {
			h.close()
			fail(err)
		}
		return
	}
	if *restore {
		defer h.close()
		if *out == "bench-results.json" {
			*out = "bench-restore.json"
		}
		if err := h.runRestoreMeasure(qs[0], *rounds, *out); err != nil {
			h.close()
			fail(err)
		}
		return
	}
	h.batch, h.baselineBatch, h.steadyRate = *batch, max(*baselineBatch, 1), *steady
	h.baselineJournal = *baselineJournal
	h.reconcileEvery, h.recent = *reconcileEvery, *recent
	defer h.close()
	onFail = h.close // fail exits without running deferred calls
	if h.callgrindDir = *callgrind; h.callgrindDir != "" {
		if err := os.MkdirAll(h.callgrindDir, 0o755); err != nil {
			fail(err)
		}
	}
	if h.profileDir = *profiles; h.profileDir != "" {
		if err := os.MkdirAll(h.profileDir, 0o755); err != nil {
			fail(err)
		}
	}
	// The first minute of a run is slower here than the rest, whatever runs
	// in it: a short unmeasured drain takes it.
	if *warmup > 0 {
		w := *h
		w.callgrindDir = "" // the warm-up is about the machine, not a count
		w.events = min(*warmup, h.events)
		w.bodies, w.keys = h.bodies[:w.events], h.keys[:w.events]
		if _, err := w.measure("bare", qs[0]); err != nil {
			fail(fmt.Errorf("warm-up: %w", err))
		}
	}
	var list []string
	for r := 0; r < max(*rounds, 1); r++ {
		list = append(list, strings.Split(*subjects, ",")...)
	}
	var results []result
	for i, q := range qs {
		// No subject always goes first: the order turns at each queue count.
		turned := append(append([]string{}, list[i%len(list):]...), list[:i%len(list)]...)
		for _, s := range turned {
			t0 := time.Now()
			r, err := h.measure(strings.TrimSpace(s), q)
			if err != nil {
				fail(fmt.Errorf("%s at %d queues: %w", s, q, err))
			}
			r.WallSeconds = time.Since(t0).Seconds()
			fmt.Fprintf(os.Stderr, "%-8s %2d queues: %8.0f events/s (set-up %.0f s, all %.0f s)\n",
				r.Subject, r.Queues, r.EventsPerSec, r.SetupSeconds, r.WallSeconds)
			results = append(results, r)
		}
	}
	printTable(os.Stdout, results)
	if err := writeJSON(*out, results); err != nil {
		fail(err)
	}
	if err := writeSVG(*svg, results); err != nil {
		fail(err)
	}
	fmt.Printf("\nwrote %s and %s\n", *out, *svg)
}

// startProfile profiles this subject's process into path until the returned
// function is called.
func startProfile(path string) func() {
	f, err := os.Create(path)
	if err != nil {
		fail(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fail(err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}
