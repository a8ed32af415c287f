package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// buildService builds the service binary from the repository root, once per
// test run, the way the README says to, and with the race detector when the
// tests have it (raceFlags), so the tests' processes are checked too.
func buildService(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "transferconsumer-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "tc")
		if out, err := exec.Command("go", append(append([]string{"build"}, raceFlags...), "-o", binary, "..")...).CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("%w: %s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("build the service: %v", buildErr)
	}
	return binary
}

// process is the service binary running as a child process, with its JSON
// log lines collected.
type process struct {
	t      *testing.T
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // the exit status, once exited is closed
	mu     sync.Mutex
	lines  []map[string]any
}

// startProcess runs the binary with the environment plus env (KEY=value).
// Log lines above INFO go to the test log.
func startProcess(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	p := &process{t: t, cmd: exec.Command(buildService(t), args...), exited: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) != nil || (line["level"] != "INFO" && line["level"] != "WARN") {
				t.Log(sc.Text())
			}
			if line != nil {
				p.mu.Lock()
				p.lines = append(p.lines, line)
				p.mu.Unlock()
			}
		}
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			p.logQuiet(80)
		}
	})
	return p
}

// logQuiet puts the last n of the process's INFO and WARN lines, which
// the test log leaves out, into it: what a failed test's service said.
func (p *process) logQuiet(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var quiet []string
	for _, line := range p.lines {
		if line["level"] == "INFO" || line["level"] == "WARN" {
			b, _ := json.Marshal(line)
			quiet = append(quiet, string(b))
		}
	}
	if len(quiet) > n {
		p.t.Logf("the process's last %d INFO and WARN lines of %d:", n, len(quiet))
		quiet = quiet[len(quiet)-n:]
	}
	for _, l := range quiet {
		p.t.Log(l)
	}
}

// count returns how many log lines have key = value.
func (p *process) count(key, value string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, line := range p.lines {
		if fmt.Sprint(line[key]) == value {
			n++
		}
	}
	return n
}

// sum returns the sum of key's numbers over the log lines whose msg is msg.
func (p *process) sum(msg, key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, line := range p.lines {
		if v, ok := line[key].(float64); ok && line["msg"] == msg {
			n += int(v)
		}
	}
	return n
}

// field returns key of the first log line whose msg is msg.
func (p *process) field(msg, key string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, line := range p.lines {
		if line["msg"] == msg {
			return fmt.Sprint(line[key])
		}
	}
	return ""
}

// said reports whether some log line whose msg is msg has key holding
// sub. Not only the first: a check the service retries may fail first for
// another cause (a read cut short on a loaded machine) before the one a
// test waits for.
func (p *process) said(msg, key, sub string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, line := range p.lines {
		if line["msg"] == msg && strings.Contains(fmt.Sprint(line[key]), sub) {
			return true
		}
	}
	return false
}

// waitConsuming waits until the process has started consuming (again).
func (p *process) waitConsuming(times int) {
	p.t.Helper()
	waitFor(p.t, 60*time.Second, "the service to consume", func() bool { return p.count("msg", "consuming") >= times })
}

// stop sends sig and waits up to timeout for the exit; it returns the exit
// error (nil for status 0).
func (p *process) stop(sig syscall.Signal, timeout time.Duration) error {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatal(err)
	}
	select {
	case <-p.exited:
		return p.err
	case <-time.After(timeout):
		p.t.Fatalf("the service did not exit within %s of %s", timeout, sig)
		return nil
	}
}

// httpAddr is where the process serves /readyz and /metrics.
func (p *process) httpAddr() string {
	p.t.Helper()
	var addr string
	waitFor(p.t, 30*time.Second, "the HTTP server", func() bool {
		addr = p.field("serving health and metrics", "addr")
		return addr != ""
	})
	return "http://" + strings.Replace(addr, "[::]", "127.0.0.1", 1)
}
