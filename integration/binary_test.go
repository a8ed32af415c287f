package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// buildService builds the service binary from the repository root, once per
// test run, the way the README says to.
func buildService(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "transferconsumer-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "tc")
		out, err := exec.Command("go", "build", "-race", "-o", binary, "..").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("%w: %s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("build the service: %v", buildErr)
	}
	return binary
}

// logLines collects the JSON log lines of a service process.
type logLines struct {
	mu    sync.Mutex
	lines []map[string]any
}

func (l *logLines) count(key, value string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if line[key] == value {
			n++
		}
	}
	return n
}

// The README's promise end to end, through the real binary: it creates and
// migrates its own database, declares its topology, applies the contract's
// sample event once though it is published twice, and exits 0 on SIGTERM.
func TestBinaryAppliesTheContractSampleOnce(t *testing.T) {
	e := newEnv(t)
	bin := buildService(t)

	// A database the service has never seen: it must create and migrate it.
	dbName := e.name + "_bin"
	admin := sqlx.MustOpen("postgres", shared.databaseURL)
	defer admin.Close()
	t.Cleanup(func() { admin.Exec("DROP DATABASE IF EXISTS " + pq.QuoteIdentifier(dbName) + " WITH (FORCE)") })
	du, _ := url.Parse(shared.databaseURL)
	du.Path = "/" + dbName
	environ := append(os.Environ(),
		"AMQP_URL="+e.amqpURL, "DATABASE_URL="+du.String(), "QUEUE_COUNT=2",
		"INSTANCE_NAME="+e.name+"-bin", "SHUTDOWN_TIMEOUT=10s")

	cmd := exec.Command(bin)
	cmd.Env = environ
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	logs := &logLines{}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) != nil || line["level"] != "INFO" {
				t.Log(sc.Text())
			}
			if line != nil {
				logs.mu.Lock()
				logs.lines = append(logs.lines, line)
				logs.mu.Unlock()
			}
		}
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
	})

	waitFor(t, 60*time.Second, "the service to consume", func() bool { return logs.count("msg", "consuming") == 1 })
	sample, err := os.ReadFile("testdata/contract-sample.json")
	if err != nil {
		t.Fatal(err)
	}
	const eventID = "3f0b1f7e-8c1a-4a55-9a51-5b0a7c2f9d10"
	e.publishRaw(prefix, "acc_00001", sample, eventID)
	e.publishRaw(prefix, "acc_00001", sample, eventID)
	e.publishRaw(prefix, "acc_00001", []byte(`{"eventId": 42}`), "")
	waitFor(t, 30*time.Second, "applied once, discarded once, dead-lettered once", func() bool {
		return logs.count("outcome", "applied") == 1 && logs.count("outcome", "duplicate") == 1 &&
			logs.count("outcome", "dead-letter") == 1
	})

	serviceDB := sqlx.MustOpen("postgres", du.String())
	defer serviceDB.Close()
	var balance int64
	var rows int
	serviceDB.Get(&balance, `SELECT balance_minor FROM balance_projection WHERE account = 'acc_00002'`)
	serviceDB.Get(&rows, `SELECT count(*) FROM processed_event WHERE event_id = $1`, eventID)
	if balance != 10000 || rows != 1 {
		t.Errorf("acc_00002 balance %d with %d inbox rows, want 10000 and 1", balance, rows)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("after SIGTERM the service exited with %v, want 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the service did not exit within 30s of SIGTERM")
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
		c.Env = environ
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
