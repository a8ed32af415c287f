package integration

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Side by side. Most tests live in a world of their own (a vhost and a
// database, servers they start themselves), spend most of their time
// waiting on brokers and databases, and begin with parallel(t): they run
// side by side, -parallel at a time. A test that changes what every test
// on its broker shares (a memory alarm, the broker's settings, a restart)
// or counts what every test leaves behind (goroutines) does not: go test
// runs such tests first, one at a time, before any parallel test starts,
// and alone(t) in each of those helpers fails a parallel test that calls
// it.
var besides sync.Map // names of the top-level tests that called parallel

func parallel(t *testing.T) {
	t.Helper()
	if strings.Contains(t.Name(), "/") {
		t.Fatal("parallel(t) is for top-level tests: a subtest's siblings would share its parent's world")
	}
	besides.Store(t.Name(), true)
	t.Parallel()
	if err := besideTurn(); err != nil {
		t.Fatal(err)
	}
}

// besideTurn holds the tests that run side by side until the file named by
// TEST_BESIDE_AFTER is free of another process's exclusive flock, once per
// run. .ci/run holds one on it while the pass against RabbitMQ 3.10 runs, so
// that the passes against 4.x run their tests that must be alone on their
// own broker beside that pass, and their side-by-side tests after it: three
// passes' side-by-side tests at once are more than two cores carry. Unset,
// nothing waits.
var besideTurn = sync.OnceValue(func() error {
	path := os.Getenv("TEST_BESIDE_AFTER")
	if path == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("TEST_BESIDE_AFTER: %w", err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
		return fmt.Errorf("TEST_BESIDE_AFTER: waiting for %s: %w", path, err)
	}
	return nil // closing f lets the lock go
})

// alone fails the test unless it runs alone: what, which the test is about
// to do, reaches every test on the same broker.
func alone(t *testing.T, what string) {
	t.Helper()
	top, _, _ := strings.Cut(t.Name(), "/")
	if _, ok := besides.Load(top); ok {
		t.Fatalf("%s reaches every test on the broker, and %s runs beside others: drop its parallel(t)", what, top)
	}
}

// waitFor polls cond until it holds or timeout passes; no test sleeps.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var p poll
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		p.pause()
	}
}

// poll paces the polls of a wait: the first after 10 ms, each later one
// after twice the pause before it, up to 100 ms. A condition that holds
// soon is seen soon, and the long waits of many tests side by side do not
// keep the database and the broker's management API answering fifty polls
// a second each, on the cores the tests share with them.
type poll struct{ last time.Duration }

func (p *poll) pause() {
	p.last = min(max(2*p.last, 10*time.Millisecond), 100*time.Millisecond)
	<-time.After(p.last)
}

// waitProgress waits until count() reaches target, for as long as it keeps
// rising: it fails only when count() has not risen for stall. A long run's
// pace follows the machine's (a slow or loaded one applies fewer events a
// second), so a whole-run deadline would measure the machine; a count that
// stops rising is what a hang looks like whatever the machine.
func waitProgress(t *testing.T, stall time.Duration, what string, target int, count func() int) {
	t.Helper()
	var p poll
	best, since := -1, time.Now()
	for {
		n := count()
		if n >= target {
			return
		}
		if n > best {
			best, since = n, time.Now()
		} else if time.Since(since) > stall {
			t.Fatalf("waiting for %s: stuck at %d of %d for %s", what, n, target, stall)
		}
		p.pause()
	}
}
