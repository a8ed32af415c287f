package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// replayPaceResult is what `replaypace` measured (BENCHMARKS.md, "How
// close a replay keeps to its rate"), written as JSON.
type replayPaceResult struct {
	Started string `json:"started"`
	Command string `json:"command"`
	Load    string `json:"loadavg_at_start"`
	// The drain: the service at BATCH_MAX=1 on Queues queues, applying a
	// backlog published before the replay began.
	Queues  int              `json:"drain_queues"`
	Runs    []replayPaceRun  `json:"runs"`
	Summary []replayPaceCell `json:"summary"`
}

// replayPaceRun is one `dlq replay` of one group.
type replayPaceRun struct {
	Load  string  `json:"load"` // idle, drain or burn
	Rate  float64 `json:"rate"` // letters/s asked; 0: no limit
	Flag  string  `json:"rate_flag"`
	Round int     `json:"round"`
	// Letters in the DLQ, all of one group; Replayed, what the run's
	// report and its audit record say it put back.
	Letters  int `json:"letters"`
	Replayed int `json:"replayed"`
	// Seconds from the audit record's started to its ended (the command's
	// own account: from before it connects to after it has replayed the
	// last letter), and the process's wall time around it.
	Seconds     float64 `json:"seconds"`
	WallSeconds float64 `json:"wall_seconds"`
	// PerSec is Replayed ÷ Seconds, Ratio that ÷ Rate. The bucket holds one
	// letter, so the first goes at once and n letters take at least
	// (n-1) ÷ Rate: Bound is (Replayed-1) ÷ Seconds ÷ Rate, above 1 only if
	// the replay went faster than its rate.
	PerSec float64 `json:"letters_per_sec"`
	Ratio  float64 `json:"ratio"`
	Bound  float64 `json:"bound_ratio"`
	// The machine during the replay: its cores' busy share (/proc/stat)
	// and /proc/loadavg at the end.
	Busy    float64 `json:"cpu_busy"`
	LoadEnd string  `json:"loadavg_at_end"`
	// The drain: events the service applied per second during the replay,
	// and events (backlog and letters put back) it had not applied yet
	// when the replay ended: above 0, it was still busy to the end.
	DrainPerSec float64 `json:"drain_events_per_sec,omitempty"`
	Unapplied   int     `json:"unapplied_at_end,omitempty"`
	DrainEvents int     `json:"drain_backlog,omitempty"`
}

// replayPaceCell is the medians of one load and one rate.
type replayPaceCell struct {
	Load        string  `json:"load"`
	Rate        float64 `json:"rate"`
	Letters     int     `json:"letters"`
	PerSec      float64 `json:"median_letters_per_sec"`
	Ratio       float64 `json:"median_ratio"`
	MinRatio    float64 `json:"min_ratio"`
	MaxRatio    float64 `json:"max_ratio"`
	MaxBound    float64 `json:"max_bound_ratio"`
	Seconds     float64 `json:"median_seconds"`
	Busy        float64 `json:"median_cpu_busy"`
	DrainPerSec float64 `json:"median_drain_events_per_sec,omitempty"`
}

// The letters' failure: a class a replay puts back without being told
// (dlq.Unreplayable: not poison, producer-conflict or unauthorized), and a
// reason whose only variable part is the event's id, so that they are one
// group. letterTemplate is dlq.Template of the reason; letterGroup is
// dlq.Fingerprint's hash of the class and it, which the service writes in
// x-failure-group.
const (
	letterClass    = "data-rejected"
	letterReason   = "apply event %s: the database rejected the transfer"
	letterTemplate = "apply event <uuid>: the database rejected the transfer"
)

func letterGroup() string {
	sum := sha256.Sum256([]byte(letterClass + "\x00" + letterTemplate))
	return hex.EncodeToString(sum[:6])
}

// runReplayPace is `go run . replaypace`: for each round, load and rate, a
// fresh vhost and database (the service's migrate and topology), a group of
// dead letters published to the DLX as the service dead-letters them
// (dlq.Copy's headers), then `transferconsumer dlq replay --group G
// [--rate N]` timed, with the machine idle, beside the service draining a
// backlog (drain), or beside two CPU-bound shells (burn).
func runReplayPace(args []string) {
	fs := flag.NewFlagSet("replaypace", flag.ExitOnError)
	ratesFlag := fs.String("rates", "50,default,500", "rates to ask, letters/s; default: leave --rate out (dlq.DefaultRate, 100); 0: --rate 0, no limit (how fast a replay can go)")
	loadsFlag := fs.String("loads", "idle,drain", "the machine during each replay: idle, drain (the service draining a backlog beside it), burn (two CPU-bound shells)")
	letters := fs.Int("letters", 1000, "letters in the group, at least")
	minSeconds := fs.Float64("min-seconds", 10, "more letters at a rate where -letters would take less than this")
	rounds := fs.Int("rounds", 3, "replays of each load and rate; the figures are medians")
	queues := fs.Int("queues", 8, "the drain's queues")
	drainRate := fs.Int("drain-rate", 2500, "the drain's backlog: this many events for each second the replay should take, and five seconds more")
	out := fs.String("out", "results/replaypace.json", "JSON results")
	fs.Parse(args)
	rates, flags := []float64{}, []string{}
	for _, s := range strings.Split(*ratesFlag, ",") {
		s = strings.TrimSpace(s)
		if s == "default" {
			rates, flags = append(rates, 100), append(flags, "")
			continue
		}
		r, err := strconv.ParseFloat(s, 64)
		if err != nil || r < 0 {
			fail(fmt.Errorf("-rates: %q is not a rate", s))
		}
		rates, flags = append(rates, r), append(flags, s)
	}
	loads := strings.Split(*loadsFlag, ",")
	for _, l := range loads {
		if l != "idle" && l != "drain" && l != "burn" {
			fail(fmt.Errorf("-loads: %q is not idle, drain or burn", l))
		}
	}
	count := func(rate float64) int { return max(*letters, int(rate**minSeconds)) }
	// A replay without a limit (rate 0) is sized for 200 letters a second,
	// about what one does beside the drain.
	backlogFor := func(rate float64) int {
		if rate == 0 {
			rate = 200
		}
		return int((float64(count(rate))/rate + 5) * float64(*drainRate))
	}
	most, mostLetters := 0, 0
	for _, r := range rates {
		most, mostLetters = max(most, backlogFor(r)), max(mostLetters, count(r))
	}
	h, err := newHarness(most+mostLetters, accountsFor(), "")
	if err != nil {
		fail(err)
	}
	onFail = h.close
	defer h.close()
	if u, err := url.Parse(h.amqpURL); err == nil {
		h.userID = u.User.Username() // the broker refuses any other
	}
	load, _ := os.ReadFile("/proc/loadavg")
	res := replayPaceResult{Started: time.Now().UTC().Format(time.RFC3339),
		Command: "go run . replaypace " + strings.Join(args, " "), Load: strings.TrimSpace(string(load)), Queues: *queues}
	for round := 1; round <= *rounds; round++ {
		for _, l := range loads {
			for k := range rates {
				// The rates take turns going first from one round to the next.
				i := (k + round - 1) % len(rates)
				drain := 0
				if l == "drain" {
					drain = backlogFor(rates[i])
				}
				r, err := h.replayPace(l, rates[i], flags[i], count(rates[i]), drain, *queues)
				if err != nil {
					fail(fmt.Errorf("%s, rate %g, round %d: %w", l, rates[i], round, err))
				}
				r.Round = round
				fmt.Printf("%-5s %4g/s  round %d: %d letters in %.2f s (process %.2f s): %.1f/s, ×%.3f of the rate (bound ×%.3f; 0: no limit); CPU busy %.0f%%; drain %.0f events/s, %d left\n",
					l, r.Rate, round, r.Replayed, r.Seconds, r.WallSeconds, r.PerSec, r.Ratio, r.Bound, 100*r.Busy, r.DrainPerSec, r.Unapplied)
				res.Runs = append(res.Runs, r)
				if err := writeReplayPace(*out, res); err != nil {
					fail(err)
				}
			}
		}
	}
	for _, l := range loads {
		for i, rate := range rates {
			c := replayPaceCell{Load: l, Rate: rate, Letters: count(rate), MinRatio: 1e9}
			var perSec, ratio, secs, busy, drain []float64
			for _, r := range res.Runs {
				if r.Load != l || r.Flag != flags[i] {
					continue
				}
				perSec, ratio, secs, busy = append(perSec, r.PerSec), append(ratio, r.Ratio), append(secs, r.Seconds), append(busy, r.Busy)
				if r.DrainPerSec > 0 {
					drain = append(drain, r.DrainPerSec)
				}
				c.MinRatio, c.MaxRatio, c.MaxBound = min(c.MinRatio, r.Ratio), max(c.MaxRatio, r.Ratio), max(c.MaxBound, r.Bound)
			}
			c.PerSec, c.Ratio, c.Seconds, c.Busy, c.DrainPerSec = medianOf(perSec), medianOf(ratio), medianOf(secs), medianOf(busy), medianOf(drain)
			res.Summary = append(res.Summary, c)
			fmt.Printf("%-5s %4g/s, %d letters: %.1f/s, ×%.3f of the rate (%.3f–%.3f; bound at most ×%.3f; 0: no limit), %.2f s, CPU busy %.0f%%\n",
				l, rate, c.Letters, c.PerSec, c.Ratio, c.MinRatio, c.MaxRatio, c.MaxBound, c.Seconds, 100*c.Busy)
		}
	}
	if err := writeReplayPace(*out, res); err != nil {
		fail(err)
	}
}

func writeReplayPace(path string, res replayPaceResult) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// replayPace measures one replay of n letters under load l; drain is the
// backlog the service drains beside it (load drain).
func (h *harness) replayPace(l string, rate float64, rateFlag string, n, drain, queues int) (replayPaceRun, error) {
	r := replayPaceRun{Load: l, Rate: rate, Flag: rateFlag, Letters: n, DrainEvents: drain}
	name := "bench_" + randomHex()
	vhostURL, dbURL, cleanup, err := h.prepare(name, queues, h.service)
	defer cleanup()
	if err != nil {
		return r, err
	}
	// The letters are the harness's last events, the backlog its first:
	// the letters put back apply beside it as events of their own.
	first := len(h.bodies) - n
	now := time.Now().UTC()
	if err := publishConfirmed(vhostURL, "transfers.dlx", n, func(i int) (string, amqp.Publishing) {
		e := h.bodies[first+i]
		var id struct {
			EventID string `json:"eventId"`
		}
		json.Unmarshal(e, &id)
		reason := fmt.Sprintf(letterReason, id.EventID)
		key := h.keys[first+i]
		return key, amqp.Publishing{
			// dlq.Copy's headers, as the service writes them for a
			// delivery of a producer it judged (x-original-user-id).
			Headers: amqp.Table{
				"x-failure-class":           letterClass,
				"x-failure-reason":          reason,
				"x-failure-group":           letterGroup(),
				"x-failed-at":               now.Add(time.Duration(i) * time.Microsecond).Format(time.RFC3339Nano),
				"x-failed-by":               "bench",
				"x-original-queue":          fmt.Sprintf("transfers.%d", i%queues),
				"x-original-exchange":       "transfers",
				"x-original-routing-key":    key,
				"x-original-delivery-count": int64(0),
				"x-original-user-id":        h.userID,
			},
			ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: e,
		}
	}); err != nil {
		return r, fmt.Errorf("publish the letters: %w", err)
	}
	if drain > 0 {
		if err := publishConfirmed(vhostURL, "transfers", drain, func(i int) (string, amqp.Publishing) {
			return h.keys[i], amqp.Publishing{DeliveryMode: amqp.Persistent, ContentType: "application/json", Body: h.bodies[i], UserId: h.userID}
		}); err != nil {
			return r, fmt.Errorf("publish the backlog: %w", err)
		}
	}
	if err := h.settle(); err != nil {
		return r, err
	}
	db, err := sql.Open("postgres", dbURL)
	if err != nil {
		return r, err
	}
	defer db.Close()

	// The load, started before the replay and stopped after it.
	var beside []*exec.Cmd
	stopBeside := func() {
		for _, c := range beside {
			syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			c.Wait()
		}
		beside = nil
	}
	defer stopBeside()
	switch l {
	case "drain":
		svc := exec.Command(h.service)
		svc.Env = append(os.Environ(), "AMQP_URL="+vhostURL, "DATABASE_URL="+dbURL, fmt.Sprintf("QUEUE_COUNT=%d", queues),
			"HTTP_ADDR="+h.httpAddr(), "INSTANCE_NAME="+name, "BATCH_MAX=1", "RECONCILE_INTERVAL=0s")
		logFile, err := os.Create(filepath.Join(h.logs, name+".log"))
		if err != nil {
			return r, err
		}
		defer logFile.Close()
		svc.Stderr, svc.Stdout = logFile, logFile
		svc.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := svc.Start(); err != nil {
			return r, err
		}
		beside = append(beside, svc)
		// Two seconds into the drain: past its start, at its pace.
		deadline := time.Now().Add(time.Minute)
		for applied := 0; applied == 0; time.Sleep(20 * time.Millisecond) {
			db.QueryRow(`SELECT count(*) FROM (SELECT 1 FROM processed_event LIMIT 1) x`).Scan(&applied)
			if time.Now().After(deadline) {
				return r, fmt.Errorf("the drain applied nothing in a minute\n%s", readTail(logFile.Name()))
			}
		}
		time.Sleep(2 * time.Second)
	case "burn":
		for range 2 {
			c := exec.Command("nice", "-n", "0", "sh", "-c", "while :; do :; done")
			c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := c.Start(); err != nil {
				return r, err
			}
			beside = append(beside, c)
		}
		time.Sleep(time.Second)
	}

	audit := filepath.Join(h.tmp, name+"-audit.jsonl")
	argv := []string{"dlq", "replay", "--group", letterGroup(), "--audit", audit}
	if rateFlag != "" {
		argv = append(argv, "--rate", rateFlag)
	}
	cmd := exec.Command(h.service, argv...)
	cmd.Env = append(os.Environ(), "AMQP_URL="+vhostURL, "DATABASE_URL="+dbURL, fmt.Sprintf("QUEUE_COUNT=%d", queues),
		"MANAGEMENT_URL="+h.mgmtURL)
	var appliedBefore, appliedAfter int
	if drain > 0 {
		db.QueryRow(`SELECT count(*) FROM processed_event`).Scan(&appliedBefore)
	}
	cpu0 := procStat()
	t0 := time.Now()
	stdout, err := cmd.Output()
	r.WallSeconds = time.Since(t0).Seconds()
	cpu1 := procStat()
	if drain > 0 {
		db.QueryRow(`SELECT count(*) FROM processed_event`).Scan(&appliedAfter)
	}
	le, _ := os.ReadFile("/proc/loadavg")
	r.LoadEnd = strings.TrimSpace(string(le))
	stopBeside()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		return r, fmt.Errorf("dlq replay: %v\n%s%s", err, tail(stdout, 2000), stderr)
	}
	if total := cpu1.total - cpu0.total; total > 0 {
		r.Busy = 1 - (cpu1.idle-cpu0.idle)/total
	}
	m := regexp.MustCompile(`replayed (\d+)\n`).FindSubmatch(stdout)
	if m == nil {
		return r, fmt.Errorf("dlq replay said no count: %s", tail(stdout, 2000))
	}
	r.Replayed, _ = strconv.Atoi(string(m[1]))
	rec, err := lastAudit(audit)
	if err != nil {
		return r, err
	}
	if rec.Replayed != r.Replayed || rec.Confirmed != r.Replayed || r.Replayed != n {
		return r, fmt.Errorf("replayed %d of %d letters, the audit record says %d (%d confirmed)", r.Replayed, n, rec.Replayed, rec.Confirmed)
	}
	r.Seconds = rec.Ended.Sub(rec.Started).Seconds()
	r.PerSec = float64(r.Replayed) / r.Seconds
	if rate > 0 {
		r.Ratio = r.PerSec / rate
		r.Bound = float64(r.Replayed-1) / r.Seconds / rate
	}
	if drain > 0 {
		r.DrainPerSec = float64(appliedAfter-appliedBefore) / r.WallSeconds
		r.Unapplied = drain + r.Replayed - appliedAfter
	}
	return r, nil
}

// auditRecord is the part of the replay's audit record (dlq.Run) read here.
type auditRecord struct {
	Started   time.Time `json:"started"`
	Ended     time.Time `json:"ended"`
	Replayed  int       `json:"replayed"`
	Confirmed int       `json:"confirmed"`
}

func lastAudit(path string) (auditRecord, error) {
	var rec auditRecord
	f, err := os.Open(path)
	if err != nil {
		return rec, fmt.Errorf("the replay's audit record: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024) // a line holds every event id
	found := false
	for sc.Scan() {
		if json.Unmarshal(sc.Bytes(), &rec) == nil {
			found = true
		}
	}
	if !found {
		return rec, fmt.Errorf("no audit record in %s: %v", path, sc.Err())
	}
	return rec, sc.Err()
}

// publishConfirmed publishes n messages, msg(i) each, to exchange with
// publisher confirms, 1,000 outstanding at a time.
func publishConfirmed(vhostURL, exchange string, n int, msg func(int) (string, amqp.Publishing)) error {
	conn, ch, err := confirmChannel(vhostURL)
	if err != nil {
		return err
	}
	defer conn.Close()
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
	for i := range n {
		key, p := msg(i)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, p)
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

// cpuTimes is the machine's CPU time from /proc/stat's first line, in
// ticks: all of it, and idle (idle and iowait).
type cpuTimes struct{ total, idle float64 }

func procStat() cpuTimes {
	var c cpuTimes
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return c
	}
	line, _, _ := strings.Cut(string(b), "\n")
	for k, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseFloat(f, 64)
		c.total += v
		if k == 3 || k == 4 {
			c.idle += v
		}
	}
	return c
}
