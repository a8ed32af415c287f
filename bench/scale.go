package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

var bg = context.Background()

// scaleResult is what `scale` measured, written as JSON.
type scaleResult struct {
	Started  string     `json:"started"`
	Command  string     `json:"command"`
	Load     string     `json:"loadavg_at_start"` // /proc/loadavg: other work on the machine
	Server   string     `json:"server_version"`
	Settings pgSettings `json:"settings"`
	Events   int        `json:"events_per_drain"`
	Queues   int        `json:"queues"`
	Accounts int        `json:"accounts"`
	InboxTTL string     `json:"inbox_ttl"`
	IDs      string     `json:"ids"` // random or time (-ids)
	// -complete-after and -transfer-fillfactor, 0 when not given.
	CompleteAfter      int `json:"complete_after,omitempty"`
	TransferFillfactor int `json:"transfer_fillfactor,omitempty"`
	// Prefills, drains and prunes, in the order they ran.
	Loads  []loadResult  `json:"loads"`
	Drains []drainResult `json:"drains"`
	Prunes []pruneResult `json:"prunes"`
	// With -reconcile, one reconciliation pass over each database, last.
	Reconciles []reconcilePass `json:"reconciles,omitempty"`
}

// reconcilePass is one run of the service's reconcile command over a
// database of Rows prefilled rows: how long it took, and its exit code
// (0 nothing found, 3 something found).
type reconcilePass struct {
	Rows     int     `json:"inbox_rows"`
	Seconds  float64 `json:"seconds"`
	ExitCode int     `json:"exit_code"`
	Output   string  `json:"output"`
}

// drainResult is one backlog drained by the service into a database of Rows
// inbox rows (0: a freshly migrated, empty one).
type drainResult struct {
	Rows      int `json:"inbox_rows"`
	Transfers int `json:"transfers"`
	BatchMax  int `json:"batch_max"`
	Round     int `json:"round"`
	// With -vary, the server setting this drain ran with (NAME=VALUE);
	// empty for the settings the run started with.
	Setting      string   `json:"setting,omitempty"`
	Events       int      `json:"events"`
	EventsPerSec float64  `json:"events_per_sec"`
	WALPerEvent  float64  `json:"wal_bytes_per_event"`
	FPIPerEvent  float64  `json:"fpi_per_event"`
	WAL          walRange `json:"wal"`
}

// pruneResult is retention over the rows older than INBOX_TTL: the owner's
// maintenance (migrate), which drops the day partitions past it, and the
// service's prune command, which deletes the other rows; then the VACUUM
// of the inbox that follows it.
type pruneResult struct {
	Rows          int      `json:"inbox_rows"`
	Deleted       int64    `json:"deleted"`
	PruneSeconds  float64  `json:"prune_seconds"`
	Maintenance   string   `json:"maintenance"` // what migrate's inbox maintenance said
	WALPerRow     float64  `json:"prune_wal_bytes_per_row"`
	VacuumPerRow  float64  `json:"vacuum_wal_bytes_per_row"`
	VacuumSeconds float64  `json:"vacuum_seconds"`
	Prune         walRange `json:"prune_wal"`
	Vacuum        walRange `json:"vacuum_wal"`
}

// runScale is `go run . scale`: the inbox and the transfers prefilled to
// each of -rows, a backlog drained into each by the service with each
// -batch, and retention over each, on a PostgreSQL server of its own
// (BENCHMARKS.md, "The inbox at scale").
func runScale(args []string) {
	fs := flag.NewFlagSet("scale", flag.ExitOnError)
	rowsFlag := fs.String("rows", "0,1000000", "inbox rows (and transfers) to prefill, one database each; 0 is an empty database, migrated afresh for each drain")
	transfersFlag := fs.String("transfers", "", "transfers to prefill for each of -rows (default: as many as the inbox rows)")
	events := fs.Int("events", 20_000, "events in each drained backlog")
	queues := fs.Int("queues", 8, "queues the backlog spreads over (QUEUE_COUNT)")
	batches := fs.String("batch", "1,50", "BATCH_MAX of each drain")
	rounds := fs.Int("rounds", 1, "drain each database with each BATCH_MAX this many times, interleaved")
	ttl := fs.Duration("ttl", 720*time.Hour, "INBOX_TTL: the prefill spreads processed_at over it, and prune removes what is older")
	expired := fs.Float64("expired", 0.03, "fraction of the prefilled inbox older than -ttl, which the measured prune removes (0.03: about a day past 30 days)")
	buildFill := fs.Int("build-fillfactor", 70, "fillfactor the prefill builds the randomly keyed indexes with, then resets (about how full random inserts leave a B-tree's leaves); 0: CREATE INDEX's default")
	var s pgSettings
	fs.StringVar(&s.CheckpointTimeout, "checkpoint-timeout", "5min", "the server's checkpoint_timeout")
	fs.StringVar(&s.MaxWALSize, "max-wal-size", "1GB", "the server's max_wal_size")
	fs.StringVar(&s.WALCompression, "wal-compression", "off", "the server's wal_compression: off, pglz, lz4 or zstd")
	fs.StringVar(&s.SharedBuffers, "shared-buffers", "128MB", "the server's shared_buffers")
	fs.StringVar(&s.Autovacuum, "autovacuum", "on", "the server's autovacuum")
	fs.StringVar(&s.WALKeepSize, "wal-keep-size", "8GB", "the server's wal_keep_size (keeps measured WAL for pg_waldump)")
	vary := fs.String("vary", "", "NAME=V1,V2,...: drain once with each value of one server setting a reload can change (wal_compression, checkpoint_timeout, max_wal_size), set by ALTER SYSTEM between drains over the same prefilled databases")
	pgBin := fs.String("pg-bin", "/usr/lib/postgresql/15/bin", "the PostgreSQL binaries: initdb, postgres, pg_waldump")
	dir := fs.String("dir", os.TempDir(), "where the server's temporary data directory goes (on the disk measured)")
	ids := fs.String("ids", "random", "the event and transfer ids, prefilled and drained: random (UUID version 4) or time (time-ordered, version 7's layout)")
	fs.IntVar(&completeAfter, "complete-after", 0, "when not 0, half of each backlog completes the other half's transfers, each this many creations after its creation")
	transferFill := fs.Int("transfer-fillfactor", 0, "when not 0, the transfer table's fillfactor, set after each migration (the prefill's rows and the drains' follow it)")
	out := fs.String("out", "", "JSON results (default results/scale-ROWS.json)")
	attach := fs.String("attach", "", "DIR:PORT: use the server an earlier run left running (its directory and port; stop that run with SIGSTOP before it removes the server), prefilling only the databases it lacks, and leave it running")
	reconcile := fs.Bool("reconcile", false, "after retention, time one pass of the service's reconcile command over each prefilled database")
	fs.Parse(args)

	switch *ids {
	case "random", "time":
		timeOrderedIDs = *ids == "time"
	default:
		fail(fmt.Errorf("-ids: random or time, not %q", *ids))
	}
	rowsList, err := intList(*rowsFlag)
	if err != nil {
		fail(fmt.Errorf("-rows: %w", err))
	}
	transfersList := rowsList
	if *transfersFlag != "" {
		if transfersList, err = intList(*transfersFlag); err != nil || len(transfersList) != len(rowsList) {
			fail(fmt.Errorf("-transfers: one count for each of -rows (%v)", err))
		}
	}
	batchList, err := intList(*batches)
	if err != nil {
		fail(fmt.Errorf("-batch: %w", err))
	}
	if *out == "" {
		var parts []string
		for _, n := range rowsList {
			parts = append(parts, humanCount(n))
		}
		*out = "results/scale-" + strings.Join(parts, "-") + ".json"
	}
	load, _ := os.ReadFile("/proc/loadavg")
	res := scaleResult{Started: time.Now().UTC().Format(time.RFC3339), Command: "go run . scale " + strings.Join(args, " "),
		Load: strings.TrimSpace(string(load)), Settings: s, Events: *events, Queues: *queues,
		Accounts: accountsFor(), InboxTTL: ttl.String(), IDs: *ids,
		CompleteAfter: completeAfter, TransferFillfactor: *transferFill}
	// The results so far, written after every prefill, drain and prune: a run of an
	// hour or more keeps what it measured if a later step fails.
	save := func() {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "scale: %v\n", err)
		}
	}

	var p *pgServer
	if *attach != "" {
		dir, port, _ := strings.Cut(*attach, ":")
		n, err := strconv.Atoi(port)
		if err != nil || dir == "" {
			fail(fmt.Errorf("-attach: want DIR:PORT, got %q", *attach))
		}
		p = &pgServer{bin: *pgBin, dir: dir, data: filepath.Join(dir, "data"), port: n, attached: true}
	} else if p, err = startPG(*pgBin, *dir, s); err != nil {
		fail(err)
	}
	// The service and its tools reach this server; the harness publishes
	// to the usual broker.
	os.Setenv("TEST_DATABASE_URL", p.url("postgres"))
	h, err := newHarness(1, res.Accounts, "")
	if err != nil {
		p.stop()
		fail(err)
	}
	h.events = *events
	stopAll := func() { h.close(); p.stop() }
	onFail = stopAll
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Fprintln(os.Stderr, "scale: interrupted; removing the server")
		stopAll()
		os.Exit(1)
	}()
	admin, err := sql.Open("postgres", p.url("postgres"))
	if err != nil {
		fail(err)
	}
	res.Server = p.version(admin)
	fmt.Fprintf(os.Stderr, "scale: PostgreSQL %s on port %d in %s (load %s)\n", res.Server, p.port, p.dir, res.Load)

	s2 := &scaleRun{h: h, p: p, admin: admin, ttl: *ttl, queues: *queues, transferFill: *transferFill}
	dbs := map[int]string{}
	for i, n := range rowsList {
		if n == 0 {
			continue
		}
		name := fmt.Sprintf("scale_%d", n)
		var exists bool
		if err := admin.QueryRow(`SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
			fail(err)
		}
		if exists && p.attached {
			fmt.Fprintf(os.Stderr, "scale: %s is there already, prefilled by an earlier run\n", name)
			dbs[n] = name
			continue
		}
		if err := s2.createDB(name); err != nil {
			fail(err)
		}
		db, err := sql.Open("postgres", p.url(name)) // prefill uses more than one connection
		if err != nil {
			fail(err)
		}
		fmt.Fprintf(os.Stderr, "scale: prefilling %s: %d inbox rows, %d transfers\n", name, n, transfersList[i])
		l, err := prefill(db, n, transfersList[i], res.Accounts, *ttl, *expired, *buildFill)
		db.Close()
		if err != nil {
			fail(fmt.Errorf("prefill %s: %w", name, err))
		}
		fmt.Fprintf(os.Stderr, "scale: prefilled %s in %.0f s: inbox %s, transfers %s, database %s\n", name, l.TotalSeconds,
			mib(l.InboxBytes), mib(l.TransferBytes), mib(l.DatabaseBytes))
		res.Loads = append(res.Loads, l)
		save()
		dbs[n] = name
	}
	settings := []string{""}
	if *vary != "" {
		name, values, ok := strings.Cut(*vary, "=")
		if !ok {
			fail(fmt.Errorf("-vary: want NAME=V1,V2,..., got %q", *vary))
		}
		settings = nil
		for _, v := range strings.Split(values, ",") {
			settings = append(settings, name+"="+strings.TrimSpace(v))
		}
	}
	seed := uint64(seed)
	for r := 1; r <= max(*rounds, 1); r++ {
		for _, setting := range settings {
			if err := s2.set(setting); err != nil {
				fail(err)
			}
			for i, n := range rowsList {
				for _, b := range batchList {
					seed++
					d, err := s2.drain(dbs[n], b, seed)
					if err != nil {
						fail(fmt.Errorf("drain at %d rows, BATCH_MAX=%d: %w", n, b, err))
					}
					d.Rows, d.Transfers, d.Round, d.Setting = n, transfersList[i], r, setting
					fmt.Fprintf(os.Stderr, "scale: %d rows, BATCH_MAX=%d%s: %.0f events/s, %.0f B and %.2f FPI per event, %d checkpoint(s)\n",
						n, b, strings.TrimRight(" "+setting, " "), d.EventsPerSec, d.WALPerEvent, d.FPIPerEvent, d.WAL.Checkpoints)
					res.Drains = append(res.Drains, d)
					save()
				}
			}
		}
	}
	if err := s2.set(""); err != nil {
		fail(err)
	}
	for _, n := range rowsList {
		if n == 0 {
			continue
		}
		pr, err := s2.prune(dbs[n])
		if err != nil {
			fail(fmt.Errorf("prune at %d rows: %w", n, err))
		}
		pr.Rows = n
		fmt.Fprintf(os.Stderr, "scale: prune at %d rows: %d deleted, %.0f B per row; vacuum after: %.0f B per row\n",
			n, pr.Deleted, pr.WALPerRow, pr.VacuumPerRow)
		res.Prunes = append(res.Prunes, pr)
		save()
	}
	for _, n := range rowsList {
		if !*reconcile || n == 0 {
			continue
		}
		rp, err := s2.reconcile(dbs[n])
		if err != nil {
			fail(fmt.Errorf("reconcile at %d rows: %w", n, err))
		}
		rp.Rows = n
		fmt.Fprintf(os.Stderr, "scale: reconcile at %d rows: %.1f s, exit %d\n", n, rp.Seconds, rp.ExitCode)
		res.Reconciles = append(res.Reconciles, rp)
		save()
	}
	admin.Close()
	stopAll()
	printScale(os.Stdout, res)
	save()
	fmt.Printf("\nwrote %s\n", *out)
}

type scaleRun struct {
	h      *harness
	p      *pgServer
	admin  *sql.DB
	ttl    time.Duration
	queues int
	// transferFill, when not 0, is set as the transfer table's fillfactor
	// after each migration.
	transferFill int
}

// set changes one server setting ("NAME=VALUE") with ALTER SYSTEM and a
// reload, and checks that a new session sees it; "" goes back to the
// settings the server started with.
func (s *scaleRun) set(setting string) error {
	if setting == "" {
		if _, err := s.admin.Exec(`ALTER SYSTEM RESET ALL`); err != nil {
			return err
		}
		_, err := s.admin.Exec(`SELECT pg_reload_conf()`)
		return err
	}
	name, value, _ := strings.Cut(setting, "=")
	if _, err := s.admin.Exec(fmt.Sprintf("ALTER SYSTEM SET %s = '%s'", name, strings.ReplaceAll(value, "'", "''"))); err != nil {
		return err
	}
	if _, err := s.admin.Exec(`SELECT pg_reload_conf()`); err != nil {
		return err
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		db := s.open("postgres")
		var got, pending string
		err := db.QueryRow(`SELECT current_setting($1), pending_restart::text FROM pg_settings WHERE name = $1`, name).Scan(&got, &pending)
		db.Close()
		if err != nil {
			return err
		}
		if pending == "true" {
			return fmt.Errorf("%s needs a restart: -vary takes only what a reload changes", name)
		}
		if strings.EqualFold(got, value) || normalizeSetting(got) == normalizeSetting(value) {
			fmt.Fprintf(os.Stderr, "scale: %s = %s\n", name, got)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is still %s, not %s, 10 s after the reload", name, got, value)
		}
	}
}

func normalizeSetting(v string) string { return strings.ToLower(strings.ReplaceAll(v, " ", "")) }

func (s *scaleRun) open(name string) *sql.DB {
	db, err := sql.Open("postgres", s.p.url(name))
	if err != nil {
		fail(err)
	}
	db.SetMaxOpenConns(1) // one backend: quiet waits for all others
	return db
}

// createDB makes a database and lets the service migrate it.
func (s *scaleRun) createDB(name string) error {
	if _, err := s.admin.Exec("CREATE DATABASE " + name); err != nil {
		return err
	}
	// Migrated with a TTL ten times -ttl, so that its inbox maintenance
	// keeps the day partitions the prefill fills past -ttl, as an inbox
	// that has run for a while has them: the measured prune drops them.
	if err := s.service(name, "", nil, "migrate", "INBOX_TTL="+(10*s.ttl).String()); err != nil || s.transferFill == 0 {
		return err
	}
	db := s.open(name)
	defer db.Close()
	_, err := db.Exec(fmt.Sprintf("ALTER TABLE transfer SET (fillfactor = %d)", s.transferFill))
	return err
}

// service runs one of the service's commands on database name (and vhost,
// when not ""), and returns its output through into when not nil. An
// argument of the form NAME=VALUE is a variable for it instead.
func (s *scaleRun) service(name, vhostURL string, into *string, args ...string) error {
	if vhostURL == "" {
		vhostURL = s.h.amqpURL
	}
	env := append(os.Environ(), "AMQP_URL="+vhostURL, "DATABASE_URL="+s.p.url(name),
		fmt.Sprintf("QUEUE_COUNT=%d", s.queues), "INBOX_TTL="+s.ttl.String())
	var cmd []string
	for _, a := range args {
		if strings.Contains(a, "=") {
			env = append(env, a) // the last of a name wins
		} else {
			cmd = append(cmd, a)
		}
	}
	args = cmd
	c := exec.Command(s.h.service, args...)
	c.Env = env
	out, err := c.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if into != nil {
		*into = string(out)
	}
	return nil
}

// drain publishes a backlog of the harness's size (from seed, so that no
// event repeats one drained before) to a fresh vhost, checkpoints, and has
// the service apply it into database name ("" for a new, empty one, removed
// after), measuring the WAL from before the service starts to the last
// event applied.
func (s *scaleRun) drain(name string, batch int, seed uint64) (drainResult, error) {
	d := drainResult{BatchMax: batch, Events: s.h.events}
	if name == "" {
		name = "scale_empty_" + randomHex()
		if err := s.createDB(name); err != nil {
			return d, err
		}
		defer s.admin.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)")
	}
	h := s.h
	h.bodies, h.keys = h.bodies[:0], h.keys[:0]
	for _, e := range backlog(h.events, h.accounts, seed) {
		b, _ := json.Marshal(e)
		h.bodies = append(h.bodies, b)
		h.keys = append(h.keys, e.Data.FromAccount)
	}
	vhost := "scale_" + randomHex()
	if err := h.mgmt(http.MethodPut, "/api/vhosts/"+vhost, nil); err != nil {
		return d, err
	}
	defer h.mgmt(http.MethodDelete, "/api/vhosts/"+vhost, nil)
	mu, _ := url.Parse(h.mgmtURL)
	if err := h.mgmt(http.MethodPut, "/api/permissions/"+vhost+"/"+mu.User.Username(),
		map[string]string{"configure": ".*", "write": ".*", "read": ".*"}); err != nil {
		return d, err
	}
	au, _ := url.Parse(h.amqpURL)
	au.Path = "/" + vhost
	if err := s.service(name, au.String(), nil, "topology"); err != nil {
		return d, err
	}
	if err := h.publish(au.String()); err != nil {
		return d, fmt.Errorf("publish: %w", err)
	}
	db := s.open(name)
	defer db.Close()
	names, err := relationNames(db)
	if err != nil {
		return d, err
	}
	if err := checkpoint(db); err != nil {
		return d, err
	}
	var mark time.Time
	if err := db.QueryRow(`SELECT clock_timestamp()`).Scan(&mark); err != nil {
		return d, err
	}
	w, err := beginWAL(db)
	if err != nil {
		return d, err
	}
	cmd := exec.Command(h.service)
	cmd.Env = append(os.Environ(), "AMQP_URL="+au.String(), "DATABASE_URL="+s.p.url(name),
		fmt.Sprintf("QUEUE_COUNT=%d", s.queues), fmt.Sprintf("BATCH_MAX=%d", batch), "HTTP_ADDR=127.0.0.1:0",
		"INSTANCE_NAME="+vhost, "PRUNE_INTERVAL=100000h", "RECONCILE_INTERVAL=0", "INBOX_TTL="+s.ttl.String())
	logPath := filepath.Join(h.logs, vhost+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return d, err
	}
	defer logFile.Close()
	defer os.Remove(logPath)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return d, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-exited
	}
	for deadline := time.Now().Add(30 * time.Minute); ; {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM processed_event WHERE processed_at >= $1`, mark).Scan(&n); err != nil {
			stop()
			return d, err
		}
		if n >= h.events {
			break
		}
		select {
		case err := <-exited:
			return d, fmt.Errorf("the service exited: %v\n%s", err, readTail(logPath))
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return d, fmt.Errorf("not drained after 30 minutes")
		}
	}
	if err := w.endLSN(db); err != nil {
		stop()
		return d, err
	}
	w.Seconds = time.Since(t0).Seconds()
	stop()
	if err := s.quiet(db); err != nil {
		return d, err
	}
	if err := w.finish(db, s.p, names); err != nil {
		return d, err
	}
	var secs float64
	if err := db.QueryRow(`SELECT extract(epoch FROM max(processed_at) - min(processed_at))::float8
		FROM processed_event WHERE processed_at >= $1`, mark).Scan(&secs); err != nil {
		return d, err
	}
	var sum int64
	if err := db.QueryRow(`SELECT coalesce(sum(balance_minor), 0) FROM balance_projection`).Scan(&sum); err != nil || sum != 0 {
		return d, fmt.Errorf("end state: balances sum to %d (%v)", sum, err)
	}
	d.WAL = w
	d.EventsPerSec = float64(h.events-1) / secs
	d.WALPerEvent = float64(w.Bytes) / float64(h.events)
	d.FPIPerEvent = float64(w.FPI) / float64(h.events)
	return d, nil
}

// quiet waits until no other client is connected to the server, so that
// the backends that did the measured work have exited and reported their
// WAL counters.
func (s *scaleRun) quiet(db *sql.DB) error {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var n int
		if err := db.QueryRow(`SELECT count(*) FROM pg_stat_activity
			WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND datname <> 'postgres'`).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
	}
	return fmt.Errorf("clients still connected after a minute")
}

var deletedLine = regexp.MustCompile(`deleted (\d+) inbox rows`)

// prune checkpoints, runs the owner's migrate (the inbox's maintenance,
// which drops the partitions past the TTL) and the service's prune command
// over database name, counting the rows they removed, then VACUUM of the
// inbox (what autovacuum would do after it), measuring
// the WAL of each.
func (s *scaleRun) prune(name string) (pruneResult, error) {
	var pr pruneResult
	db := s.open(name)
	defer db.Close()
	names, err := relationNames(db)
	if err != nil {
		return pr, err
	}
	if err := checkpoint(db); err != nil {
		return pr, err
	}
	w, err := beginWAL(db)
	if err != nil {
		return pr, err
	}
	var rowsBefore, rowsAfter int64
	if err := db.QueryRow(`SELECT count(*) FROM processed_event`).Scan(&rowsBefore); err != nil {
		return pr, err
	}
	// Retention is the owner's maintenance, which drops the day partitions
	// past the TTL (adr/0011), then the service's prune of the other rows.
	t0 := time.Now()
	var out string
	if err := s.service(name, "", &out, "migrate"); err != nil {
		return pr, err
	}
	pr.Maintenance = out
	if err := s.service(name, "", &out, "prune"); err != nil {
		return pr, err
	}
	pr.PruneSeconds = time.Since(t0).Seconds()
	if m := deletedLine.FindStringSubmatch(out); m == nil {
		return pr, fmt.Errorf("prune said %q", out)
	}
	if err := db.QueryRow(`SELECT count(*) FROM processed_event`).Scan(&rowsAfter); err != nil {
		return pr, err
	}
	pr.Deleted = rowsBefore - rowsAfter
	if err := w.endLSN(db); err != nil {
		return pr, err
	}
	w.Seconds = pr.PruneSeconds
	if err := s.quiet(db); err != nil {
		return pr, err
	}
	if err := w.finish(db, s.p, names); err != nil {
		return pr, err
	}
	pr.Prune = w
	if w, err = beginWAL(db); err != nil {
		return pr, err
	}
	// In a connection of its own, closed after, so that its backend
	// reports its WAL counters as it exits.
	vac := s.open(name)
	t0 = time.Now()
	_, err = vac.Exec("VACUUM processed_event")
	vac.Close()
	if err != nil {
		return pr, err
	}
	pr.VacuumSeconds = time.Since(t0).Seconds()
	if err := w.endLSN(db); err != nil {
		return pr, err
	}
	w.Seconds = pr.VacuumSeconds
	if err := s.quiet(db); err != nil {
		return pr, err
	}
	if err := w.finish(db, s.p, names); err != nil {
		return pr, err
	}
	pr.Vacuum = w
	if pr.Deleted > 0 {
		pr.WALPerRow = float64(pr.Prune.Bytes) / float64(pr.Deleted)
		pr.VacuumPerRow = float64(pr.Vacuum.Bytes) / float64(pr.Deleted)
	}
	return pr, nil
}

// reconcile times the service's reconcile command over database name,
// without the DLQ (--skip-dlq, as the -reconcile benchmark runs it).
func (s *scaleRun) reconcile(name string) (reconcilePass, error) {
	var rp reconcilePass
	c := exec.Command(s.h.service, "reconcile", "--skip-dlq")
	c.Env = append(os.Environ(), "DATABASE_URL="+s.p.url(name), "INBOX_TTL="+s.ttl.String())
	t0 := time.Now()
	out, err := c.CombinedOutput()
	rp.Seconds = time.Since(t0).Seconds()
	rp.Output = string(out)
	if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 3 {
		rp.ExitCode, err = 3, nil
	}
	if err != nil {
		return rp, fmt.Errorf("%v\n%s", err, out)
	}
	return rp, nil
}

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a count", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// humanCount writes 1000000 as 1M, 10000 as 10k.
func humanCount(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return strconv.Itoa(n/1_000_000) + "M"
	case n >= 1000 && n%1000 == 0:
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// checkpoint runs CHECKPOINT and waits until pg_stat_bgwriter counts it
// (the checkpointer reports it after the command returns), so that a range
// begun after it does not count it.
func checkpoint(db *sql.DB) error {
	count := func() (n int64, err error) {
		err = db.QueryRow(`SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter`).Scan(&n)
		return n, err
	}
	before, err := count()
	if err != nil {
		return err
	}
	if _, err := db.Exec("CHECKPOINT"); err != nil {
		return err
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if n, err := count(); err != nil || n > before {
			return err
		}
	}
	return fmt.Errorf("the CHECKPOINT was not counted within 10 s")
}
