package integration

import (
	"bytes"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// The README's promise end to end, through the real binary: it creates and
// migrates its own database, declares its topology, applies the contract's
// sample event once though it is published twice, and exits 0 on SIGTERM.
func TestBinaryAppliesTheContractSampleOnce(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	bin := buildService(t)

	// A database the service has never seen: it must create and migrate it.
	dbName := e.name + "_bin"
	admin := sqlx.MustOpen("postgres", shared.databaseURL)
	t.Cleanup(func() { admin.Close() }) // after the drop below: cleanups run last-in, first-out
	t.Cleanup(func() {
		if _, err := admin.Exec("DROP DATABASE IF EXISTS " + pq.QuoteIdentifier(dbName) + " WITH (FORCE)"); err != nil {
			t.Errorf("drop %s: %v", dbName, err)
		}
	})
	du, _ := url.Parse(shared.databaseURL)
	du.Path = "/" + dbName
	environ := []string{
		"AMQP_URL=" + e.amqpURL, "DATABASE_URL=" + du.String(), "QUEUE_COUNT=2",
		"INSTANCE_NAME=" + e.name + "-bin", "SHUTDOWN_TIMEOUT=10s", "HTTP_ADDR=127.0.0.1:0",
	}
	proc := startProcess(t, environ)
	proc.waitConsuming(1)

	sample, err := os.ReadFile("testdata/contract-sample.json")
	if err != nil {
		t.Fatal(err)
	}
	const eventID = "3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10"
	e.publishRaw(prefix, "acc_00001", sample, eventID)
	e.publishRaw(prefix, "acc_00001", sample, eventID)
	// Poison whose eventId can be read: the dead letter's log line names it.
	const poisonID = "9d0a9c1e-5b1f-4f0e-8f7a-2f7c1d3b4a55"
	e.publishRaw(prefix, "acc_00001", []byte(strings.NewReplacer("3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10", poisonID,
		"10000", "-100").Replace(string(sample))), "")
	waitFor(t, 30*time.Second, "applied once, discarded once, dead-lettered once", func() bool {
		return proc.count("outcome", "applied") == 1 && proc.count("outcome", "duplicate") == 1 &&
			proc.count("outcome", "dead_lettered") == 1
	})
	if proc.count("event_id", poisonID) != 1 {
		t.Errorf("the dead letter's log line does not name event %s", poisonID)
	}

	serviceDB := sqlx.MustOpen("postgres", du.String())
	defer serviceDB.Close()
	var balance int64
	var rows int
	serviceDB.Get(&balance, `SELECT balance_minor FROM balance_projection WHERE account = 'acc_00002'`)
	serviceDB.Get(&rows, `SELECT count(*) FROM processed_event WHERE event_id = $1`, eventID)
	if balance != 10000 || rows != 1 {
		t.Errorf("acc_00002 balance %d with %d inbox rows, want 10000 and 1", balance, rows)
	}

	base := proc.httpAddr()
	var ready map[string]any
	if code := getJSON(t, base+"/readyz", &ready); code != 200 || ready["ready"] != true {
		t.Errorf("/readyz = %d %v, want 200 and ready", code, ready)
	}
	waitFor(t, 30*time.Second, "the DLQ's depth in /metrics", func() bool {
		return metricValue(getText(t, base+"/metrics"), "transferconsumer_dlq_messages") == 1
	})
	metrics := getText(t, base+"/metrics")
	for _, c := range []struct {
		name  string
		match []string
	}{
		{"transferconsumer_events_total", []string{`class=""`, `outcome="applied"`}},
		{"transferconsumer_events_total", []string{`class=""`, `outcome="duplicate"`}},
		{"transferconsumer_events_total", []string{`class="poison"`, `outcome="dead_lettered"`}},
		{"transferconsumer_event_processing_seconds_count", []string{`outcome="applied"`}},
	} {
		if got := metricSum(metrics, c.name, c.match...); got != 1 {
			t.Errorf("/metrics: %s%v sums to %v, want 1", c.name, c.match, got)
		}
	}
	for _, want := range []string{
		`transferconsumer_queues_blocked 0`,
		`transferconsumer_unconsumed_queues 0`,
		`transferconsumer_broker_connected 1`,
		`transferconsumer_queues_consumed 2`,
		`transferconsumer_database_up 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// Without GOGC, the service sets its own collection target (main.go).
	if _, set := os.LookupEnv("GOGC"); !set {
		want := "\ngo_gc_gogc_percent 400\n"
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", strings.TrimSpace(want))
		}
	}

	if err := proc.stop(syscall.SIGTERM, 30*time.Second); err != nil {
		t.Errorf("after SIGTERM the service exited with %v, want 0", err)
	}

	// The subcommands alone, against what now exists.
	for _, sub := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate"}, "applied 0 migration(s)"},
		{[]string{"topology"}, "declared exchange transfers"},
		{[]string{"dlq", "list"}, "transfers.dlq: 1 dead letter(s)"},
		{[]string{"dlq", "replay", "--class", "poison", "--dry-run"}, "would replay 1"},
	} {
		c := exec.Command(bin, sub.args...)
		c.Env = append(os.Environ(), environ...)
		var out bytes.Buffer
		c.Stdout, c.Stderr = &out, &out
		if err := c.Run(); err != nil || !strings.Contains(out.String(), sub.want) {
			t.Errorf("%v: %v, want output with %q:\n%s", sub.args, err, sub.want, out.String())
		}
	}
	if n := len(e.peekDLQ()); n != 1 {
		t.Errorf("after list and a dry run the DLQ holds %d, want 1", n)
	}
}
