package main

import (
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// reconcileScaleResult is what `reconcile-scale` measured, written as
// JSON (BENCHMARKS.md, "The periodic pass").
type reconcileScaleResult struct {
	Started  string     `json:"started"`
	Command  string     `json:"command"`
	Load     string     `json:"loadavg_at_start"`
	Server   string     `json:"server_version"`
	Settings pgSettings `json:"settings"`
	Accounts int        `json:"accounts"`
	// Events applied before each periodic pass: New creations, and
	// Failures of transfers of the history still created.
	New      int                  `json:"new_transfers"`
	Failures int                  `json:"failures_of_older_transfers"`
	Sizes    []reconcileScaleSize `json:"sizes"`
}

// reconcileScaleSize is one database of Transfers transfers of history.
type reconcileScaleSize struct {
	Transfers int        `json:"transfers"`
	Load      loadResult `json:"load"`
	// The first periodic pass, which has no checkpoint: a full pass that
	// makes it.
	FirstSeconds float64 `json:"first_pass_seconds"`
	// Each round: the events applied, then one `reconcile --periodic`:
	// its process's wall time, the time its report gives, and the
	// transfers it read since the cut-off.
	ApplySeconds    []float64 `json:"apply_seconds"`
	PeriodicSeconds []float64 `json:"periodic_seconds"`
	PeriodicQuery   []float64 `json:"periodic_query_seconds"`
	PeriodicRead    []int     `json:"periodic_transfers_read"`
	// Then `reconcile` (the full pass, read only), as many times.
	FullSeconds []float64 `json:"full_seconds"`
	FullQuery   []float64 `json:"full_query_seconds"`
	// Sizes after the runs.
	TransferBytes int64 `json:"transfer_bytes"`
	RangeBytes    int64 `json:"transfer_created_range_bytes"`
}

// runReconcileScale is `go run . reconcile-scale`: on a PostgreSQL server
// of its own, for each -transfers, a database prefilled with that much
// history (prefill's), its checkpoint made by a first periodic pass, then
// -rounds times -new transfers (and a failure of an older one every
// -fail-every) applied through apply_event and one periodic pass timed;
// then -rounds full passes timed. The databases take turns within each
// round.
func runReconcileScale(args []string) {
	fs := flag.NewFlagSet("reconcile-scale", flag.ExitOnError)
	sizesFlag := fs.String("transfers", "100000,10000000", "transfers of history, one database each")
	newN := fs.Int("new", 10_000, "transfers created before each periodic pass")
	failEvery := fs.Int("fail-every", 20, "with every this many creations, a failure of a transfer of the history still created (0: none)")
	rounds := fs.Int("rounds", 3, "periodic passes, and full passes, per database")
	accounts := fs.Int("accounts", 10_000, "accounts the history and the new transfers spread over")
	pgBin := fs.String("pg-bin", "/usr/lib/postgresql/15/bin", "the PostgreSQL binaries")
	dir := fs.String("dir", os.TempDir(), "where the server's temporary data directory goes")
	out := fs.String("out", "", "JSON results (default results/reconcile-scale-SIZES.json)")
	logStatements := fs.Bool("log-statements", false, "log every statement's duration in the server's log (log_min_duration_statement = 0), to see where a pass spends its time (with -keep)")
	keep := fs.Bool("keep", false, "leave the server and its databases running at the end, to look into (it says where; stop it with pg_ctl)")
	var s pgSettings
	fs.StringVar(&s.CheckpointTimeout, "checkpoint-timeout", "5min", "the server's checkpoint_timeout")
	fs.StringVar(&s.MaxWALSize, "max-wal-size", "1GB", "the server's max_wal_size")
	fs.StringVar(&s.SharedBuffers, "shared-buffers", "128MB", "the server's shared_buffers")
	fs.StringVar(&s.Autovacuum, "autovacuum", "on", "the server's autovacuum (which summarizes the BRIN ranges filled)")
	s.WALCompression, s.WALKeepSize = "off", "1GB"
	fs.Parse(args)
	sizes, err := intList(*sizesFlag)
	if err != nil {
		fail(fmt.Errorf("-transfers: %w", err))
	}
	if *out == "" {
		var parts []string
		for _, n := range sizes {
			parts = append(parts, humanCount(n))
		}
		*out = "results/reconcile-scale-" + strings.Join(parts, "-") + ".json"
	}
	load, _ := os.ReadFile("/proc/loadavg")
	res := reconcileScaleResult{Started: time.Now().UTC().Format(time.RFC3339), Command: "go run . reconcile-scale " + strings.Join(args, " "),
		Load: strings.TrimSpace(string(load)), Settings: s, Accounts: *accounts, New: *newN}
	if *failEvery > 0 {
		res.Failures = *newN / *failEvery
	}
	save := func() {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "reconcile-scale: %v\n", err)
		}
	}
	p, err := startPG(*pgBin, *dir, s)
	if err != nil {
		fail(err)
	}
	onFail = p.stop
	if *keep {
		p.attached = true // stop leaves it
		defer fmt.Fprintf(os.Stderr, "reconcile-scale: the server runs on, in %s, port %d\n", p.dir, p.port)
	}
	defer p.stop()
	admin, err := sql.Open("postgres", p.url("postgres"))
	if err != nil {
		fail(err)
	}
	defer admin.Close()
	res.Server = p.version(admin)
	if *logStatements {
		if _, err := admin.Exec(`ALTER SYSTEM SET log_min_duration_statement = 0`); err != nil {
			fail(err)
		}
		admin.Exec(`SELECT pg_reload_conf()`)
	}
	service := filepath.Join(os.TempDir(), "transferconsumer-reconcile-scale-"+randomHex())
	build := exec.Command("go", "build", "-o", service, ".")
	build.Dir = ".."
	if b, err := build.CombinedOutput(); err != nil {
		fail(fmt.Errorf("build the service: %v\n%s", err, b))
	}
	defer os.Remove(service)

	// Every database is prefilled and given its checkpoint first; then the
	// rounds take each database in turn (the order turning each round), so
	// that what the machine does meanwhile falls on all of them alike.
	type database struct {
		name, url string
		db        *sql.DB
	}
	var dbs []database
	res.Sizes = make([]reconcileScaleSize, len(sizes))
	for i, n := range sizes {
		d := database{name: fmt.Sprintf("rscale_%d", n)}
		d.url = p.url(d.name)
		if _, err := admin.Exec("CREATE DATABASE " + d.name); err != nil {
			fail(err)
		}
		c := exec.Command(service, "migrate")
		c.Env = append(os.Environ(), "DATABASE_URL="+d.url)
		if b, err := c.CombinedOutput(); err != nil {
			fail(fmt.Errorf("migrate: %v\n%s", err, b))
		}
		if d.db, err = sql.Open("postgres", d.url); err != nil {
			fail(err)
		}
		defer d.db.Close()
		sz := &res.Sizes[i]
		sz.Transfers = n
		fmt.Fprintf(os.Stderr, "reconcile-scale: prefilling %s with %d transfers\n", d.name, n)
		if sz.Load, err = prefill(d.db, 0, n, *accounts, 720*time.Hour, 0, 0); err != nil {
			fail(fmt.Errorf("prefill %s: %w", d.name, err))
		}
		wall, _, rep, err := rscalePass(service, d.url, "--periodic")
		if err != nil || rep["pass"] != "full" {
			fail(fmt.Errorf("the first periodic pass: %v, pass %v", err, rep["pass"]))
		}
		sz.FirstSeconds = wall
		fmt.Fprintf(os.Stderr, "reconcile-scale: %d: the first pass, which makes the checkpoint: %.1f s\n", n, wall)
		dbs = append(dbs, d)
		save()
	}
	turn := func(round int) []int {
		var order []int
		for i := range dbs {
			order = append(order, (i+round)%len(dbs))
		}
		return order
	}
	for round := 1; round <= *rounds; round++ {
		for _, i := range turn(round) {
			d, sz := dbs[i], &res.Sizes[i]
			evs, err := newTransfers(d.db, *newN, *failEvery, *accounts)
			if err != nil {
				fail(err)
			}
			t0 := time.Now()
			if err := applyAll(d.db, evs, 4); err != nil {
				fail(err)
			}
			sz.ApplySeconds = append(sz.ApplySeconds, time.Since(t0).Seconds())
			wall, query, rep, err := rscalePass(service, d.url, "--periodic")
			if err != nil {
				fail(err)
			}
			read, _ := rep["transfers"].(float64)
			if rep["pass"] != "periodic" || int(read) != len(evs) {
				fail(fmt.Errorf("round %d: pass %v read %v transfers; want a periodic one over the %d applied", round, rep["pass"], read, len(evs)))
			}
			sz.PeriodicSeconds, sz.PeriodicQuery = append(sz.PeriodicSeconds, wall), append(sz.PeriodicQuery, query)
			sz.PeriodicRead = append(sz.PeriodicRead, int(read))
			fmt.Fprintf(os.Stderr, "reconcile-scale: %d: periodic pass after %d events: %.3f s (%.3f s in the database)\n",
				sz.Transfers, len(evs), wall, query)
			save()
		}
	}
	for round := 1; round <= *rounds; round++ {
		for _, i := range turn(round) {
			d, sz := dbs[i], &res.Sizes[i]
			wall, query, _, err := rscalePass(service, d.url)
			if err != nil {
				fail(err)
			}
			sz.FullSeconds, sz.FullQuery = append(sz.FullSeconds, wall), append(sz.FullQuery, query)
			fmt.Fprintf(os.Stderr, "reconcile-scale: %d: full pass: %.1f s\n", sz.Transfers, wall)
			save()
		}
	}
	for i, d := range dbs {
		d.db.QueryRow(`SELECT pg_total_relation_size('transfer'), pg_relation_size('transfer_created_range')`).
			Scan(&res.Sizes[i].TransferBytes, &res.Sizes[i].RangeBytes)
		if !*keep {
			d.db.Close()
			admin.Exec("DROP DATABASE " + d.name + " WITH (FORCE)")
		}
	}
	printReconcileScale(os.Stdout, res)
	save()
	fmt.Printf("\nwrote %s\n", *out)
}

// rscalePass runs `reconcile --json --skip-dlq args…` of service on the
// database of url and returns its process's wall time, the time its
// report gives, and the report. Finding something is an error here: the
// history and the new transfers hold none.
func rscalePass(service, url string, args ...string) (wall, query float64, rep map[string]any, err error) {
	c := exec.Command(service, append([]string{"reconcile", "--json", "--skip-dlq"}, args...)...)
	c.Env = append(os.Environ(), "DATABASE_URL="+url)
	t0 := time.Now()
	b, err := c.Output()
	wall = time.Since(t0).Seconds()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 3 {
		return wall, 0, nil, fmt.Errorf("reconcile %v found something:\n%s", args, b)
	}
	if err != nil {
		return wall, 0, nil, fmt.Errorf("reconcile %v: %v\n%s%s", args, err, b, exitStderr(err))
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		return wall, 0, nil, err
	}
	ms, _ := rep["duration_ms"].(float64)
	return wall, ms / 1000, rep, nil
}

func exitStderr(err error) string {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return string(exit.Stderr)
	}
	return ""
}

// newTransfers returns n creations among accounts accounts, and with every
// failEvery of them the failure of a transfer of the history still
// created (read from db), each failure from its transfer's own account.
func newTransfers(db *sql.DB, n, failEvery, accounts int) ([]sqlEvent, error) {
	evs := lifecycleCreations(n, accounts)
	if failEvery <= 0 {
		return evs, nil
	}
	rows, err := db.Query(`SELECT transfer_id, from_account, to_account, amount_minor FROM transfer
		WHERE state = 'created' AND currency = 'EUR' LIMIT $1`, n/failEvery)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		e := sqlEvent{ID: uuidV4(), Type: "TransferFailed"}
		if err := rows.Scan(&e.Transfer, &e.From, &e.To, &e.Amount); err != nil {
			return nil, err
		}
		evs = append(evs, e)
	}
	return evs, rows.Err()
}

// lifecycleCreations is n creations of lifecycle's.
func lifecycleCreations(n, accounts int) []sqlEvent {
	var out []sqlEvent
	for _, e := range lifecycle(2*n+20, accounts, uint64(time.Now().UnixNano())) {
		if e.Type == "TransferCreated" && len(out) < n {
			out = append(out, e)
		}
	}
	return out
}

// printReconcileScale prints the medians of each database, and the ratio
// of each to the smallest's.
func printReconcileScale(w io.Writer, r reconcileScaleResult) {
	fmt.Fprintf(w, "reconciliation over a history, %d accounts; %d new transfers and %d failures of older ones before each periodic pass\n",
		r.Accounts, r.New, r.Failures)
	fmt.Fprintf(w, "%-12s %14s %10s %16s %10s %14s\n", "transfers", "periodic (s)", "ratio", "in the db (s)", "full (s)", "first pass (s)")
	var base float64
	for i, sz := range r.Sizes {
		p := medianOf(sz.PeriodicSeconds)
		if i == 0 {
			base = p
		}
		fmt.Fprintf(w, "%-12d %14.3f %10.2f %16.3f %10.2f %14.2f\n", sz.Transfers, p, p/base, medianOf(sz.PeriodicQuery),
			medianOf(sz.FullSeconds), sz.FirstSeconds)
	}
}
