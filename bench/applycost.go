package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// applyCostResult is what `applycost` measured: the database's cost of
// applying events with the schema of a baseline build and with this
// one's, written as JSON (BENCHMARKS.md, "What the checkpoint costs the
// apply path").
type applyCostResult struct {
	Started  string     `json:"started"`
	Command  string     `json:"command"`
	Load     string     `json:"loadavg_at_start"`
	Server   string     `json:"server_version"`
	Settings pgSettings `json:"settings"`
	Baseline string     `json:"baseline"`
	Events   int        `json:"events_per_run"`
	Accounts int        `json:"accounts"`
	Prefill  int        `json:"prefilled_transfers"`
	// Callgrind: the server ran under valgrind's callgrind, and each run
	// counts its backend's instructions.
	Callgrind bool           `json:"callgrind"`
	Runs      []applyCostRun `json:"runs"`
}

// applyCostRun is one run of Events events, one per transaction, on one
// connection, into the database of one schema.
type applyCostRun struct {
	Schema  string `json:"schema"` // "baseline", "current", or -variant's name
	Round   int    `json:"round"`
	Seconds float64
	// WAL: pg_wal_lsn_diff over the run (the server does nothing else:
	// autovacuum off, a CHECKPOINT before), and pg_stat_wal's counters.
	WALBytes    int64   `json:"wal_bytes"`
	Records     int64   `json:"wal_records"`
	FPI         int64   `json:"fpi"`
	WALPerEvent float64 `json:"wal_bytes_per_event"`
	FPIPerEvent float64 `json:"fpi_per_event"`
	// The backend's CPU time (/proc), and under callgrind its
	// instructions, less those of a session that applies nothing.
	CPUMicrosPerEvent  float64 `json:"backend_cpu_us_per_event"`
	Instructions       int64   `json:"instructions,omitempty"`
	InstrPerEvent      float64 `json:"instructions_per_event,omitempty"`
	IdleInstructions   int64   `json:"idle_session_instructions,omitempty"`
	CheckpointsInRange int64   `json:"checkpoints"`
	// The range split by relation (pg_waldump).
	WAL walRange `json:"wal"`
}

// runApplyCost is `go run . applycost`: on a PostgreSQL server of its own,
// two databases, one migrated by a baseline build of the service (before
// the reconciliation's checkpoint, sql/0016) and one by this one, each
// prefilled alike; then, -rounds times and in turns, the same events
// applied into each through apply_event, one per transaction as the
// service's lane sends them, measuring the WAL and the server's CPU (and,
// with -callgrind, instructions) per event.
func runApplyCost(args []string) {
	fs := flag.NewFlagSet("applycost", flag.ExitOnError)
	baseline := fs.String("baseline", "", "a build of the service before sql/0016 (required): git archive COMMIT | tar -x -C DIR, then go build in DIR")
	events := fs.Int("events", 20_000, "events per run (of every 20: 10 creations, 9 completions, 1 failure)")
	rounds := fs.Int("rounds", 3, "runs of each schema, in turns")
	accounts := fs.Int("accounts", 10_000, "accounts the events spread over")
	prefillN := fs.Int("transfers", 0, "transfers to prefill each database with (prefill's history)")
	variant := fs.String("variant", "", "NAME:SQL: a third database, migrated by this build, then changed by SQL (e.g. btree:CREATE INDEX ON transfer (created_xid)), measured beside the two")
	callgrind := fs.String("callgrind", "", "run the server under valgrind's callgrind, writing its counts into this directory, and report instructions per event (slow: use -events 2000)")
	pgBin := fs.String("pg-bin", "/usr/lib/postgresql/15/bin", "the PostgreSQL binaries")
	dir := fs.String("dir", os.TempDir(), "where the server's temporary data directory goes")
	out := fs.String("out", "results/applycost.json", "JSON results")
	fs.Parse(args)
	if *baseline == "" {
		fail(fmt.Errorf("-baseline: a build of the service before sql/0016 is required"))
	}
	load, _ := os.ReadFile("/proc/loadavg")
	s := pgSettings{CheckpointTimeout: "1h", MaxWALSize: "10GB", WALCompression: "off", SharedBuffers: "256MB", Autovacuum: "off", WALKeepSize: "1GB"}
	res := applyCostResult{Started: time.Now().UTC().Format(time.RFC3339), Command: "go run . applycost " + strings.Join(args, " "),
		Load: strings.TrimSpace(string(load)), Settings: s, Baseline: *baseline, Events: *events, Accounts: *accounts,
		Prefill: *prefillN, Callgrind: *callgrind != ""}
	var wrap []string
	if *callgrind != "" {
		if err := os.MkdirAll(*callgrind, 0o777); err != nil {
			fail(err)
		}
		os.Chmod(*callgrind, 0o777) // the server writes there as postgres
		wrap = []string{"valgrind", "--tool=callgrind", "--trace-children=no", "--callgrind-out-file=" + filepath.Join(*callgrind, "pg.%p.out")}
	}
	p, err := startPGWith(*pgBin, *dir, s, wrap)
	if err != nil {
		fail(err)
	}
	onFail = p.stop
	defer p.stop()
	admin, err := sql.Open("postgres", p.url("postgres"))
	if err != nil {
		fail(err)
	}
	defer admin.Close()
	res.Server = p.version(admin)
	current := filepath.Join(os.TempDir(), "transferconsumer-applycost-"+randomHex())
	build := exec.Command("go", "build", "-o", current, ".")
	build.Dir = ".."
	if b, err := build.CombinedOutput(); err != nil {
		fail(fmt.Errorf("build the service: %v\n%s", err, b))
	}
	defer os.Remove(current)
	type schema struct{ name, bin, sql string }
	schemas := []schema{{"baseline", *baseline, ""}, {"current", current, ""}}
	if *variant != "" {
		name, q, ok := strings.Cut(*variant, ":")
		if !ok || name == "" || strings.ContainsAny(name, " -") {
			fail(fmt.Errorf("-variant: want NAME:SQL, got %q", *variant))
		}
		schemas = append(schemas, schema{name, current, q})
	}
	for _, sc := range schemas {
		if _, err := admin.Exec("CREATE DATABASE applycost_" + sc.name); err != nil {
			fail(err)
		}
		c := exec.Command(sc.bin, "migrate")
		c.Env = append(os.Environ(), "DATABASE_URL="+p.url("applycost_"+sc.name))
		if b, err := c.CombinedOutput(); err != nil {
			fail(fmt.Errorf("migrate with %s: %v\n%s", sc.bin, err, b))
		}
		if sc.sql != "" {
			db, _ := sql.Open("postgres", p.url("applycost_"+sc.name))
			_, err := db.Exec(sc.sql)
			db.Close()
			if err != nil {
				fail(fmt.Errorf("-variant %s: %w", sc.name, err))
			}
		}
		if *prefillN > 0 {
			db, _ := sql.Open("postgres", p.url("applycost_"+sc.name))
			_, err := prefill(db, 0, *prefillN, *accounts, 720*time.Hour, 0, 0)
			db.Close()
			if err != nil {
				fail(fmt.Errorf("prefill %s: %w", sc.name, err))
			}
		}
	}
	save := func() {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "applycost: %v\n", err)
		}
	}
	for round := 1; round <= *rounds; round++ {
		evs := lifecycle(*events, *accounts, uint64(seed+round))
		// The order turns each round.
		var order []schema
		for i := range schemas {
			order = append(order, schemas[(i+round)%len(schemas)])
		}
		for _, sc := range order {
			// The same events into each database: new ids per run, the
			// same accounts and amounts.
			run, err := applyCostOnce(p, admin, "applycost_"+sc.name, renew(evs), *callgrind)
			if err != nil {
				fail(fmt.Errorf("%s, round %d: %w", sc.name, round, err))
			}
			run.Schema, run.Round = sc.name, round
			fmt.Fprintf(os.Stderr, "applycost: %-8s round %d: %.0f B WAL, %.3f FPI, %.0f µs CPU, %.0f instructions per event\n",
				sc.name, round, run.WALPerEvent, run.FPIPerEvent, run.CPUMicrosPerEvent, run.InstrPerEvent)
			res.Runs = append(res.Runs, run)
			save()
		}
	}
	printApplyCost(os.Stdout, res)
	save()
	fmt.Printf("\nwrote %s\n", *out)
}

// renew gives evs new event and transfer ids, keeping each transition
// with its transfer.
func renew(evs []sqlEvent) []sqlEvent {
	ids := map[string]string{}
	out := make([]sqlEvent, len(evs))
	for i, e := range evs {
		if _, ok := ids[e.Transfer]; !ok {
			ids[e.Transfer] = uuidV4()
		}
		e.ID, e.Transfer = uuidV4(), ids[e.Transfer]
		out[i] = e
	}
	return out
}

// applyCostOnce applies evs into database name on one connection, one
// per transaction, measuring the WAL, the backend's CPU and, under
// callgrind (cgDir), its instructions.
func applyCostOnce(p *pgServer, admin *sql.DB, name string, evs []sqlEvent, cgDir string) (applyCostRun, error) {
	var run applyCostRun
	ctx := context.Background()
	if err := checkpoint(admin); err != nil {
		return run, err
	}
	db, err := sql.Open("postgres", p.url(name))
	if err != nil {
		return run, err
	}
	defer db.Close()
	names, err := relationNames(db)
	if err != nil {
		return run, err
	}
	db.SetMaxOpenConns(1)
	conn, err := db.Conn(ctx)
	if err != nil {
		return run, err
	}
	var pid int
	if err := conn.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return run, err
	}
	w, err := beginWAL(admin)
	if err != nil {
		return run, err
	}
	_, cpu0, _ := procCPU(pid)
	t0 := time.Now()
	for _, e := range evs {
		if err := e.apply(ctx, conn); err != nil {
			conn.Close()
			return run, err
		}
	}
	run.Seconds = time.Since(t0).Seconds()
	_, cpu1, _ := procCPU(pid)
	if err := w.endLSN(admin); err != nil {
		return run, err
	}
	conn.Close()
	db.Close() // the backend exits: its WAL counters, and callgrind's file, are written
	if err := waitGone(admin, pid); err != nil {
		return run, err
	}
	if err := w.finish(admin, p, names); err != nil {
		return run, err
	}
	run.WAL, run.WALBytes = w, w.Bytes
	n := float64(len(evs))
	run.Records, run.FPI, run.CheckpointsInRange = w.StatRecords, w.StatFPI, w.Checkpoints
	run.WALPerEvent, run.FPIPerEvent = float64(run.WALBytes)/n, float64(run.FPI)/n
	run.CPUMicrosPerEvent = (cpu1 - cpu0) * 1e6 / n
	if cgDir != "" {
		if run.Instructions, err = backendInstructions(cgDir, pid); err != nil {
			return run, err
		}
		// A session that connects, asks its pid and leaves.
		idle, err := idleSession(p, admin, name, cgDir)
		if err != nil {
			return run, err
		}
		run.IdleInstructions = idle
		run.InstrPerEvent = float64(run.Instructions-idle) / n
	}
	return run, nil
}

// waitGone waits until backend pid has left pg_stat_activity.
func waitGone(admin *sql.DB, pid int) error {
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var n int
		if err := admin.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
	}
	return fmt.Errorf("backend %d still there after two minutes", pid)
}

// idleSession counts the instructions of a session that applies nothing.
func idleSession(p *pgServer, admin *sql.DB, name, cgDir string) (int64, error) {
	db, err := sql.Open("postgres", p.url(name))
	if err != nil {
		return 0, err
	}
	var pid int
	err = db.QueryRow(`SELECT pg_backend_pid()`).Scan(&pid)
	db.Close()
	if err != nil {
		return 0, err
	}
	if err := waitGone(admin, pid); err != nil {
		return 0, err
	}
	return backendInstructions(cgDir, pid)
}

// backendInstructions reads the instruction total callgrind wrote for the
// backend pid as it exited.
func backendInstructions(cgDir string, pid int) (int64, error) {
	path := filepath.Join(cgDir, "pg."+strconv.Itoa(pid)+".out")
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		b, err := os.ReadFile(path)
		if err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				for _, prefix := range []string{"summary: ", "totals: "} {
					if rest, ok := strings.CutPrefix(line, prefix); ok {
						return strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
					}
				}
			}
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("no instruction total in %s (%v)", path, err)
		}
	}
}

// printApplyCost prints the medians of each schema and their ratios.
func printApplyCost(w io.Writer, r applyCostResult) {
	med := func(schema string, f func(applyCostRun) float64) float64 {
		var v []float64
		for _, run := range r.Runs {
			if run.Schema == schema {
				v = append(v, f(run))
			}
		}
		return medianOf(v)
	}
	fmt.Fprintf(w, "apply_event, %d events per run (10 creations, 9 completions, 1 failure in 20), one per transaction, %d transfers prefilled\n",
		r.Events, r.Prefill)
	var others []string
	for _, run := range r.Runs {
		if run.Schema != "baseline" && run.Schema != "current" && !slices.Contains(others, run.Schema) {
			others = append(others, run.Schema)
		}
	}
	fmt.Fprintf(w, "%-26s %12s %12s %8s", "median per event", "baseline", "current", "ratio")
	for _, o := range others {
		fmt.Fprintf(w, " %12s %8s", o, "ratio")
	}
	fmt.Fprintln(w)
	for _, m := range []struct {
		name string
		f    func(applyCostRun) float64
	}{
		{"WAL bytes", func(x applyCostRun) float64 { return x.WALPerEvent }},
		{"full-page images", func(x applyCostRun) float64 { return x.FPIPerEvent }},
		{"WAL records", func(x applyCostRun) float64 { return float64(x.Records) / float64(r.Events) }},
		{"backend CPU µs", func(x applyCostRun) float64 { return x.CPUMicrosPerEvent }},
		{"backend instructions", func(x applyCostRun) float64 { return x.InstrPerEvent }},
	} {
		b, c := med("baseline", m.f), med("current", m.f)
		if b == 0 && c == 0 {
			continue
		}
		fmt.Fprintf(w, "%-26s %12.3f %12.3f %8.3f", m.name, b, c, c/b)
		for _, o := range others {
			v := med(o, m.f)
			fmt.Fprintf(w, " %12.3f %8.3f", v, v/b)
		}
		fmt.Fprintln(w)
	}
}
