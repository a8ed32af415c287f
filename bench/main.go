// Command bench measures the service against the Go peer (Watermill), a
// bare amqp091-go + database/sql loop, and the limits of the database and
// the broker, on the same machine, data and queues, in one run. Run it from
// the repository root with `cd bench && go run .` (see BENCHMARKS.md).
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
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
		}
	}
	queues := flag.String("queues", "1,8,32", "queue counts to measure")
	events := flag.Int("events", 40_000, "events in each backlog")
	subjects := flag.String("subjects", "service,peer,bare,dbonly,ackonly", "what to measure")
	out := flag.String("out", "bench-results.json", "machine-readable results")
	svg := flag.String("svg", "bench-throughput.svg", "plot of events/s against queue count")
	profile := flag.String("cpuprofile", "", "write a 5 s CPU profile of the service at the largest queue count here")
	flag.Parse()
	var qs []int
	for _, s := range strings.Split(*queues, ",") {
		q, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || q < 1 {
			fail(fmt.Errorf("-queues: %q is not a queue count", s))
		}
		qs = append(qs, q)
	}
	h, err := newHarness(*events, accountsFor())
	if err != nil {
		fail(err)
	}
	defer h.close()
	h.profile = *profile
	for _, q := range qs {
		h.profileQueues = max(h.profileQueues, q)
	}
	var results []result
	for _, q := range qs {
		for _, s := range strings.Split(*subjects, ",") {
			r, err := h.measure(strings.TrimSpace(s), q)
			if err != nil {
				fail(fmt.Errorf("%s at %d queues: %w", s, q, err))
			}
			fmt.Fprintf(os.Stderr, "%-8s %2d queues: %8.0f events/s\n", r.Subject, r.Queues, r.EventsPerSec)
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
