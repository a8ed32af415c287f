package integration

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
)

// An incident's dead letters worked group by group, as an operator types it
// (the README's "Working through a DLQ group by group"): 300 events of three
// failures, dead-lettered by the service across four queues, are three
// groups in `dlq list`; one group replayed at 50/s takes at least its count
// ÷ 50 less one second and leaves the other two; its letters, dead-lettered
// again, carry their replay count; a replay interrupted by SIGINT loses and
// duplicates no letter, and a second run goes on; a poison group is left
// alone by a replay that does not name its class, and dropped whole; the
// audit log says what each run did.
func TestDLQGroupsWorkedOneByOne(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	const queues, n = 4, 100
	svc := e.start(queues, nil)
	run := randomSuffix()

	// Three failures, n events each, on accounts spread over the queues:
	// a zero amount and a lower-case currency (poison), and a completion
	// of a transfer that had failed (invalid-transition), whose reason
	// names its own transfer id.
	var transitions []string // the completions' event ids
	for i := 0; i < n; i++ {
		zero := newTransfer(fmt.Sprintf("acc_zero_%d_%s", i, run), "acc_to_"+run, 0)
		e.publish(zero)
		lower := newTransfer(fmt.Sprintf("acc_cur_%d_%s", i, run), "acc_to_"+run, 100)
		lower.Data.Currency = "eur"
		e.publish(lower)
		created := newTransfer(fmt.Sprintf("acc_tr_%d_%s", i, run), "acc_to_"+run, 100)
		e.publish(created)
		failed, completed := created, created
		failed.EventID, failed.EventType = newUUID(), "TransferFailed"
		completed.EventID, completed.EventType = newUUID(), "TransferCompleted"
		e.publish(failed)
		e.publish(completed)
		transitions = append(transitions, completed.EventID)
	}
	queue := dlq.Queue(prefix)
	waitFor(t, 120*time.Second, "the 300 letters in the DLQ", func() bool { return e.ready(queue) == 3*n })

	zeroGroup := dlq.Fingerprint("poison", "data.amountMinor 0 is not positive")
	currencyGroup := dlq.Fingerprint("poison", `data.currency "eur" is not three upper-case letters`)
	// db wraps the database's reason with the event's id.
	transitionGroup := dlq.Fingerprint("invalid-transition",
		"apply event "+newUUID()+": TransferCompleted for transfer "+newUUID()+", which is already failed")

	// dlq list: three groups, n letters each.
	groups := e.listGroups()
	for _, g := range []struct{ fp, class string }{{zeroGroup, "poison"}, {currencyGroup, "poison"}, {transitionGroup, "invalid-transition"}} {
		if got := groups[g.fp]; got.count != n || got.class != g.class || got.replayed != 0 {
			t.Errorf("dlq list: group %s is %+v, want %d %s letters, none replayed before", g.fp, got, n, g.class)
		}
	}
	if len(groups) != 3 {
		t.Errorf("dlq list shows %d groups, want 3: %+v", len(groups), groups)
	}

	// One group at 50/s: never faster than that, and the others stay.
	audit := filepath.Join(t.TempDir(), "dlq-audit.jsonl")
	withAudit := []string{"DLQ_AUDIT_LOG=" + audit}
	start := time.Now()
	out, stderr, err := e.command(nil, withAudit, "dlq", "replay", "--group", transitionGroup, "--rate", "50")
	took := time.Since(start)
	if err != nil || !strings.Contains(out, fmt.Sprintf("replayed %d\n", n)) {
		t.Fatalf("dlq replay --group %s --rate 50: %v\n%s%s", transitionGroup, err, out, stderr)
	}
	if least := time.Duration(n/50-1) * time.Second; took < least {
		t.Errorf("%d letters replayed at 50/s in %s, less than %s", n, took, least)
	}
	t.Logf("%d letters replayed at 50/s in %s", n, took)

	// The consumer dead-letters them again: each shows its replay count.
	failedAgain := func() int {
		k := 0
		for _, id := range transitions {
			if len(svc.rec.of(id)) >= 2 {
				k++
			}
		}
		return k
	}
	waitFor(t, 120*time.Second, "the replayed letters dead-lettered again", func() bool { return failedAgain() == n })
	waitFor(t, 60*time.Second, "the DLQ to hold them again", func() bool { return e.ready(queue) == 3*n })
	counted := 0
	for _, m := range e.peekDLQ() { // as the management UI's "Get messages" shows them
		if m.header(dlq.HeaderGroup) == transitionGroup {
			if fmt.Sprint(m.header(dlq.HeaderReplayCount)) != "1" || m.header(dlq.HeaderReplayedAt) == nil {
				t.Errorf("a replayed letter back in the DLQ shows %s %v, %s %v; want 1 and a time",
					dlq.HeaderReplayCount, m.header(dlq.HeaderReplayCount), dlq.HeaderReplayedAt, m.header(dlq.HeaderReplayedAt))
			}
			counted++
		}
	}
	if counted != n {
		t.Errorf("%d letters of group %s in the DLQ, want %d", counted, transitionGroup, n)
	}
	groups = e.listGroups()
	if g := groups[transitionGroup]; g.count != n || g.replayed != n {
		t.Errorf("dlq list after the replay: group %s is %+v, want %d letters, all replayed before", transitionGroup, g, n)
	}
	for _, fp := range []string{zeroGroup, currencyGroup} {
		if g := groups[fp]; g.count != n || g.replayed != 0 {
			t.Errorf("dlq list after the replay: group %s is %+v, want its %d letters untouched", fp, g, n)
		}
	}

	// Interrupted: with the consumer stopped, what a replay put back stays
	// in the partition queues, so each letter can be found, once, on one
	// side or the other.
	svc.stop()
	// Its stderr is a terminal, where it shows its progress.
	c := exec.Command(buildService(t), "dlq", "replay", "--group", transitionGroup, "--rate", "10")
	c.Env = append(os.Environ(), e.commandEnv(queues, withAudit...)...)
	var cout strings.Builder
	master, term := newPTY(t)
	cerr := &lockedText{}
	go func() { _, _ = io.Copy(cerr, master) }() // until the test closes master
	c.Stdout, c.Stderr = &cout, term
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- c.Wait() }()
	t.Cleanup(func() { _ = c.Process.Kill() })
	republished := func() int {
		k := 0
		for i := 0; i < queues; i++ {
			k += e.ready(e.topology(queues).Queue(i))
		}
		return k
	}
	waitFor(t, 60*time.Second, "half the group republished", func() bool { return republished() >= n/2 })
	if err := c.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	waitFor(t, 60*time.Second, "the interrupted replay to exit", func() bool {
		select {
		case waitErr = <-exited:
			return true
		default:
			return false
		}
	})
	if waitErr == nil {
		t.Errorf("the interrupted replay exited with status 0, want 1\n%s", cout.String())
	}
	waitFor(t, 30*time.Second, "the terminal to say the replay was interrupted", func() bool {
		return strings.Contains(cerr.String(), "dlq replay interrupted")
	})
	if text := cerr.String(); !progressShown.MatchString(text) {
		t.Errorf("the terminal shows no progress (replayed, left to read, rate):\n%q", text)
	}
	moved := e.partitionIDs(queues)
	left := e.dlqGroupIDs(transitionGroup)
	if len(moved) == n {
		t.Fatalf("the replay put all %d letters back before its interrupt: the test shows nothing", n)
	}
	t.Logf("interrupted after %d of %d letters: %d republished, %d in the DLQ", len(moved), n, len(moved), len(left))
	checkOnce(t, transitions, moved, left)

	// The record of the interrupted run names what it did.
	runs := readRuns(t, audit)
	if len(runs) != 2 {
		t.Fatalf("%d runs in the audit log, want 2", len(runs))
	}
	if r := runs[0]; r.Command != "replay" || r.Filter.Group != transitionGroup || r.Filter.Rate != 50 ||
		r.Confirmed != n || len(r.EventIDs) != n || r.Interrupted || r.User == "" || r.Ended.Before(r.Started) {
		t.Errorf("the first run's record: %+v", r)
	}
	r := runs[1]
	if !r.Interrupted || r.Filter.Group != transitionGroup || r.Confirmed != len(moved) || r.Replayed != r.Confirmed ||
		len(r.EventIDs) != len(moved) {
		t.Errorf("the interrupted run's record: %+v; want interrupted, %d confirmed", r, len(moved))
	}
	for _, id := range r.EventIDs {
		if moved[id] != 1 {
			t.Errorf("the record names event %s, which is not in the partition queues", id)
		}
	}

	// Again: it goes on with the rest.
	out, stderr, err = e.command(nil, withAudit, "dlq", "replay", "--group", transitionGroup, "--rate", "0")
	if err != nil || !strings.Contains(out, fmt.Sprintf("replayed %d\n", n-len(moved))) {
		t.Fatalf("the replay run again: %v, want %d replayed\n%s%s", err, n-len(moved), out, stderr)
	}
	checkOnce(t, transitions, e.partitionIDs(queues), e.dlqGroupIDs(transitionGroup))
	if k := len(e.dlqGroupIDs(transitionGroup)); k != 0 {
		t.Errorf("%d letters of the group still in the DLQ after the second run", k)
	}
	if runs := readRuns(t, audit); len(runs) != 3 || runs[2].Confirmed != n-len(moved) || runs[2].Interrupted {
		t.Errorf("the audit log after the second run: %+v", runs)
	}
	groups = e.listGroups()
	if len(groups) != 2 || groups[zeroGroup].count != n || groups[currencyGroup].count != n {
		t.Errorf("dlq list after the replays: %+v, want the two poison groups, untouched", groups)
	}

	// Safe by default, per group: a poison group is not replayed unless
	// its class is named.
	out, stderr, err = e.command(nil, withAudit, "dlq", "replay", "--group", zeroGroup)
	if err != nil || !strings.Contains(out, "replayed 0\n") || !strings.Contains(out, fmt.Sprintf("left alone: %d poison", n)) {
		t.Errorf("dlq replay --group %s without --class: %v, want the poison left alone\n%s%s", zeroGroup, err, out, stderr)
	}
	if runs := readRuns(t, audit); len(runs) != 4 || runs[3].Confirmed != 0 || runs[3].Skipped != n {
		t.Errorf("the audit log after the replay that left the poison: %+v", runs[len(runs)-1])
	}

	// A poison group is dropped whole, recorded, and the run in the log.
	record := filepath.Join(t.TempDir(), "dropped.jsonl")
	out, stderr, err = e.command(nil, withAudit, "dlq", "drop", "--group", zeroGroup, "--record", record, "--yes")
	if err != nil || !strings.Contains(out, fmt.Sprintf("dropped %d\n", n)) {
		t.Fatalf("dlq drop --group %s: %v\n%s%s", zeroGroup, err, out, stderr)
	}
	if runs := readRuns(t, audit); len(runs) != 5 || runs[4].Command != "drop" || runs[4].Dropped != n ||
		len(runs[4].EventIDs) != n || runs[4].Filter.Group != zeroGroup {
		t.Errorf("the audit log after the drop: %+v", runs[len(runs)-1])
	}
	if len(readRecordFile(t, record)) != n {
		t.Errorf("the drop's record holds %d letters, want %d", len(readRecordFile(t, record)), n)
	}
	groups = e.listGroups()
	if len(groups) != 1 || groups[currencyGroup].count != n {
		t.Errorf("dlq list at the end: %+v, want the currency group alone, untouched", groups)
	}
}

// progressShown matches replay's progress line on a terminal.
var progressShown = regexp.MustCompile(`replayed \d+, \d+ of \d+ letter\(s\) left to read, \d+\.\d/s`)

// lockedText is a text buffer one goroutine writes while another reads.
type lockedText struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedText) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedText) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// listedGroup is one group as `dlq list` prints it.
type listedGroup struct {
	count, replayed int
	class           string
}

// listGroups runs `dlq list` and reads its groups, by fingerprint.
func (e *env) listGroups() map[string]listedGroup {
	e.t.Helper()
	out, stderr, err := e.command(nil, nil, "dlq", "list", "-n", "0")
	if err != nil {
		e.t.Fatalf("dlq list: %v\n%s%s", err, out, stderr)
	}
	groups := map[string]listedGroup{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 8 || !dlq.IsFingerprint(f[0]) {
			continue
		}
		// GROUP COUNT CLASS FIRST LAST QUEUES[ +N] REPLAYED REASON…
		i := 6
		if strings.HasPrefix(f[i], "+") {
			i++
		}
		count, err1 := strconv.Atoi(f[1])
		replayed, err2 := strconv.Atoi(f[i])
		if err := errors.Join(err1, err2); err != nil {
			e.t.Fatalf("dlq list's line %q: %v", sc.Text(), err)
		}
		groups[f[0]] = listedGroup{count: count, replayed: replayed, class: f[2]}
	}
	return groups
}

// partitionIDs returns the message ids in the partition queues, each with
// its count: consumed (a single-active-consumer queue refuses basic.get)
// and returned. The service is stopped, so this is the one consumer.
func (e *env) partitionIDs(queues int) map[string]int {
	e.t.Helper()
	conn, err := amqp.DialConfig(e.amqpURL, amqp.Config{Properties: amqp.Table{"connection_name": e.name + "-peek"}})
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	ids := map[string]int{}
	for i := 0; i < queues; i++ {
		queue := e.topology(queues).Queue(i)
		want := e.ready(queue)
		if want == 0 {
			continue
		}
		ch, err := conn.Channel()
		if err != nil {
			e.t.Fatal(err)
		}
		deliveries, err := ch.Consume(queue, e.name+"-peek", false, false, false, false, nil)
		if err != nil {
			e.t.Fatal(err)
		}
		var last uint64
		deadline := time.After(30 * time.Second)
		for got := 0; got < want; got++ {
			select {
			case d := <-deliveries:
				ids[d.MessageId]++
				last = d.DeliveryTag
			case <-deadline:
				e.t.Fatalf("%d of the %d messages of %s delivered in 30 s", got, want, queue)
			}
		}
		if err := ch.Nack(last, true, true); err != nil { // multiple, requeue
			e.t.Fatal(err)
		}
		ch.Close()
	}
	return ids
}

// dlqGroupIDs returns the event ids of the group's letters in the DLQ,
// each with its count.
func (e *env) dlqGroupIDs(group string) map[string]int {
	e.t.Helper()
	conn, err := amqp.DialConfig(e.amqpURL, amqp.Config{Properties: amqp.Table{"connection_name": e.name + "-list"}})
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	s, err := dlq.ListMatching(conn, prefix, math.MaxInt, dlq.Filter{Group: group})
	if err != nil {
		e.t.Fatal(err)
	}
	ids := map[string]int{}
	for _, l := range s.Letters {
		ids[l.EventID]++
	}
	return ids
}

// checkOnce fails unless each of want is in exactly one of the two places,
// once, and nothing else is in either.
func checkOnce(t *testing.T, want []string, republished, inDLQ map[string]int) {
	t.Helper()
	for _, id := range want {
		if k := republished[id] + inDLQ[id]; k != 1 {
			t.Errorf("event %s: %d republished, %d in the DLQ; want once in all", id, republished[id], inDLQ[id])
		}
	}
	for _, m := range []map[string]int{republished, inDLQ} {
		for id := range m {
			if !slices.Contains(want, id) {
				t.Errorf("event %s is not one of the group's", id)
			}
		}
	}
}

// readRuns reads the audit log, one dlq.Run a line.
func readRuns(t *testing.T, name string) []dlq.Run {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var runs []dlq.Run
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r dlq.Run
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		runs = append(runs, r)
	}
	return runs
}
