package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
)

// median is the median of f over the runs of subject at queues (of the two
// middle runs, their mean), and how many runs there were.
func median(results []result, subject string, queues int, f func(result) float64) (float64, int) {
	var v []float64
	for _, r := range results {
		if r.Subject == subject && r.Queues == queues {
			v = append(v, f(r))
		}
	}
	if len(v) == 0 {
		return 0, 0
	}
	sort.Float64s(v)
	return (v[(len(v)-1)/2] + v[len(v)/2]) / 2, len(v)
}

func rate(r result) float64        { return r.EventsPerSec }
func cpuPerEvent(r result) float64 { return r.CPUConsumer }

// printTable prints every measurement, then the ratios the targets are
// about, each taken from the same run.
func printTable(w io.Writer, results []result) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "subject\tqueues\tevents/s\tp50 ms\tp99 ms\tCPU s/1k consumer\tbroker\tdatabase\tconsumer share\tpeak RSS MiB\t")
	for _, r := range results {
		total := r.CPUConsumer + r.CPUBroker + r.CPUDatabase
		share := 0.0
		if total > 0 {
			share = 100 * r.CPUConsumer / total
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.2f\t%.2f\t%.3f\t%.3f\t%.3f\t%.0f%%\t%.1f\t\n", r.Subject, r.Queues, r.EventsPerSec,
			r.P50ms, r.P99ms, r.CPUConsumer, r.CPUBroker, r.CPUDatabase, share, r.PeakRSSMiB)
	}
	tw.Flush()

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "queues\truns\tservice/peer (≥1.00)\tservice/bare (≥0.95)\tCPU per event service/bare (≤1.10)\t")
	for _, q := range queueCounts(results) {
		if _, n := median(results, "service", q, rate); n == 0 {
			continue
		}
		ratio := func(subject string, f func(result) float64) string {
			return medianRatio(results, "service", subject, q, f)
		}
		_, runs := median(results, "service", q, rate)
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t\n", q, runs, ratio("peer", rate), ratio("bare", rate), ratio("bare", cpuPerEvent))
	}
	tw.Flush()
	printBatchRatios(w, results)
	printJournalRatios(w, results)
	printReconcileRatios(w, results)
	printPerEvent(w, results, "instr/event", instrPerEvent)
	printPerEvent(w, results, "syscalls/event", func(r result) float64 { return r.SyscallsPerEvent })

	if !hasSubject(results, "baseline") {
		return
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "queues\tevents/s baseline/bare\tservice/bare\tCPU per event baseline/bare\tservice/bare\t")
	for _, q := range queueCounts(results) {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t\n", q,
			medianRatio(results, "baseline", "bare", q, rate), medianRatio(results, "service", "bare", q, rate),
			medianRatio(results, "baseline", "bare", q, cpuPerEvent), medianRatio(results, "service", "bare", q, cpuPerEvent))
	}
	tw.Flush()
}

func instrPerEvent(r result) float64 { return r.InstrPerEvent }

// printPerEvent prints a count per event that f reads from each consumer's
// results (-callgrind's user-space instructions, -syscalls' system calls),
// and their ratios to the bare loop's: counts, not times, so they hold from
// run to run on a busy machine.
func printPerEvent(w io.Writer, results []result, name string, f func(result) float64) {
	var subjects []string
	for _, s := range []string{"service", "batch", "baseline", "peer", "bare"} {
		for _, r := range results {
			if r.Subject == s && f(r) > 0 {
				subjects = append(subjects, s)
				break
			}
		}
	}
	if len(subjects) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "queues\t")
	for _, s := range subjects {
		fmt.Fprintf(tw, "%s %s\t", s, name)
	}
	for _, s := range subjects {
		if s != "bare" {
			fmt.Fprintf(tw, "%s/bare\t", s)
		}
	}
	fmt.Fprintln(tw)
	for _, q := range queueCounts(results) {
		fmt.Fprintf(tw, "%d\t", q)
		for _, s := range subjects {
			v, _ := median(results, s, q, f)
			fmt.Fprintf(tw, "%.0f\t", v)
		}
		for _, s := range subjects {
			if s != "bare" {
				fmt.Fprintf(tw, "%s\t", medianRatio(results, s, "bare", q, f))
			}
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// medianRatio is a's median of f over b's at queues; with one run of each,
// simply their ratio.
func medianRatio(results []result, a, b string, queues int, f func(result) float64) string {
	x, n := median(results, a, queues, f)
	y, m := median(results, b, queues, f)
	if n == 0 || m == 0 || y == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", x/y)
}

func hasSubject(results []result, subject string) bool {
	for _, r := range results {
		if r.Subject == subject {
			return true
		}
	}
	return false
}

func queueCounts(results []result) []int {
	seen := map[int]bool{}
	var qs []int
	for _, r := range results {
		if !seen[r.Queues] {
			seen[r.Queues] = true
			qs = append(qs, r.Queues)
		}
	}
	sort.Ints(qs)
	return qs
}

func readJSON(path string) ([]result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var results []result
	return results, json.Unmarshal(b, &results)
}

func writeJSON(path string, results []result) error {
	b, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// writeSVG plots events/s (the median of a subject's runs) against queue
// count for the service, the peer and the bare loop, and the limits when
// measured.
func writeSVG(path string, results []result) error {
	const w, h, left, bottom, top, right = 640, 400, 70, 50, 30, 150
	qs := queueCounts(results)
	maxRate := 1.0
	for _, r := range results {
		maxRate = max(maxRate, r.EventsPerSec)
	}
	x := func(i int) float64 {
		if len(qs) == 1 {
			return left
		}
		return left + float64(i)*float64(w-left-right)/float64(len(qs)-1)
	}
	y := func(v float64) float64 { return float64(h-bottom) - v/maxRate*float64(h-bottom-top) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="18" font-size="14">events/s against queue count (same run, same machine)</text>`+"\n", left)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, h-bottom, w-right, h-bottom)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, top, left, h-bottom)
	for i, q := range qs {
		fmt.Fprintf(&b, `<text x="%.0f" y="%d" text-anchor="middle">%d</text>`+"\n", x(i), h-bottom+18, q)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">queues</text>`+"\n", (left+w-right)/2, h-10)
	for k := 0; k <= 4; k++ {
		v := maxRate * float64(k) / 4
		fmt.Fprintf(&b, `<text x="%d" y="%.0f" text-anchor="end">%.0f</text>`+"\n", left-6, y(v)+4, v)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.0f" x2="%d" y2="%.0f" stroke="#ddd"/>`+"\n", left, y(v), w-right, y(v))
	}
	colors := map[string]string{"service": "#d62728", "batch": "#ff7f0e", "peer": "#1f77b4", "bare": "#2ca02c", "dbonly": "#999999", "ackonly": "#bbbbbb"}
	legend := 0
	for _, subject := range []string{"service", "batch", "peer", "bare", "dbonly", "ackonly"} {
		var pts []string
		for i, q := range qs {
			if v, n := median(results, subject, q, rate); n > 0 {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(i), y(v)))
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", x(i), y(v), colors[subject])
			}
		}
		if len(pts) == 0 {
			continue
		}
		dash := ""
		if subject == "dbonly" || subject == "ackonly" {
			dash = ` stroke-dasharray="4 3"`
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(pts, " "), colors[subject], dash)
		ly := top + 10 + legend*18
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", w-right+10, ly, w-right+30, ly, colors[subject], dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", w-right+36, ly+4, subject)
		legend++
	}
	b.WriteString("</svg>\n")
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// printJournalRatios prints, when the journal's subjects were measured
// beside the service's, how many times their events/s, CPU per event and
// WAL per event are the service's without the journal, at BATCH_MAX 1
// (journal/service) and at -batch (batch-journal/batch).
func printJournalRatios(w io.Writer, results []result) {
	wal := func(r result) float64 { return r.WALPerEvent }
	var pairs [][2]string
	for _, p := range [][2]string{{"journal", "service"}, {"batch-journal", "batch"}} {
		if hasSubject(results, p[0]) && hasSubject(results, p[1]) {
			pairs = append(pairs, p)
		}
	}
	if len(pairs) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "queues\t")
	perTx := func(r result) float64 { return r.EventsPerTx }
	msgs := func(r result) float64 { return r.JournalMsgsPerEvent }
	for _, p := range pairs {
		fmt.Fprintf(tw, "events/s %[1]s/%[2]s\tCPU per event %[1]s/%[2]s\tWAL per event %[1]s/%[2]s\tstream messages per event, %[1]s\t", p[0], p[1])
		if p[1] == "batch" {
			fmt.Fprintf(tw, "events per transaction %s, %s\t", p[0], p[1])
		}
	}
	fmt.Fprintln(tw)
	for _, q := range queueCounts(results) {
		fmt.Fprintf(tw, "%d\t", q)
		for _, p := range pairs {
			m, _ := median(results, p[0], q, msgs)
			fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t", medianRatio(results, p[0], p[1], q, rate),
				medianRatio(results, p[0], p[1], q, cpuPerEvent), medianRatio(results, p[0], p[1], q, wal), m)
			if p[1] == "batch" {
				x, _ := median(results, p[0], q, perTx)
				y, _ := median(results, p[1], q, perTx)
				fmt.Fprintf(tw, "%.1f, %.1f\t", x, y)
			}
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// printBatchRatios prints, when the subject batch was measured beside the
// service, how many times its events/s and latency are the service's
// (BATCH_MAX=-batch against BATCH_MAX=1).
func printBatchRatios(w io.Writer, results []result) {
	if !hasSubject(results, "batch") || !hasSubject(results, "service") {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "queues	events/s batch/service	p99 batch/service	CPU per event batch/service	")
	p99 := func(r result) float64 { return r.P99ms }
	for _, q := range queueCounts(results) {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t\n", q, medianRatio(results, "batch", "service", q, rate),
			medianRatio(results, "batch", "service", q, p99), medianRatio(results, "batch", "service", q, cpuPerEvent))
	}
	tw.Flush()
}

// printReconcileRatios prints, when the subject reconciling was measured
// beside the service, how many times its events/s and its CPU per event
// (the service's and the database's) are the service's, which runs with
// no periodic pass, and the passes it ran in a drain and their time.
func printReconcileRatios(w io.Writer, results []result) {
	if !hasSubject(results, "reconciling") || !hasSubject(results, "service") {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "queues\tevents/s reconciling/service\tCPU per event reconciling/service\tdatabase CPU per event\tpasses per drain\tseconds of passes per drain\t")
	database := func(r result) float64 { return r.CPUDatabase }
	passes := func(r result) float64 { return float64(r.ReconcilePasses) }
	seconds := func(r result) float64 {
		sum := 0.0
		for _, s := range r.ReconcileSeconds {
			sum += s
		}
		return sum
	}
	for _, q := range queueCounts(results) {
		p, _ := median(results, "reconciling", q, passes)
		s, _ := median(results, "reconciling", q, seconds)
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%.0f\t%.2f\t\n", q, medianRatio(results, "reconciling", "service", q, rate),
			medianRatio(results, "reconciling", "service", q, cpuPerEvent), medianRatio(results, "reconciling", "service", q, database), p, s)
	}
	tw.Flush()
}
