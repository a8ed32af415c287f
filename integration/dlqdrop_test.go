//go:build linux

package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
)

// `dlq drop` against a real broker: a person finishing with dead letters
// that will never apply. Nothing leaves the DLQ without its record; what the
// filters leave out, a dry run, a "no" and a refused confirmation leave in
// place. (Linux: the confirmation is typed on a pseudo-terminal.)

// letter is a dead letter as the service makes it: the original message
// with the failure headers (dlq.Copy), published to the dead-letter exchange.
type letter struct {
	id, class, reason string
	body              []byte
}

// deadLetters publishes letters to the DLX, each confirmed, with the
// service's headers, a content type, a timestamp and a header of the
// producer's own.
func (e *env) deadLetters(letters ...letter) {
	e.t.Helper()
	for i, l := range letters {
		d := amqp.Delivery{Exchange: prefix, RoutingKey: fmt.Sprintf("acc_%d_%s", i, e.name), MessageId: l.id,
			ContentType: "application/json", Timestamp: time.Now().Truncate(time.Second),
			Headers: amqp.Table{"producer": "test"}, Body: l.body}
		p := dlq.Copy(d, dlq.Failure{Class: l.class, Reason: l.reason, Queue: prefix + ".0", Instance: e.name, At: time.Now()})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		dc, err := e.pub.PublishWithDeferredConfirmWithContext(ctx, dlq.Exchange(prefix), d.RoutingKey, true, false, p)
		if err == nil {
			var ok bool
			if ok, err = dc.WaitContext(ctx); err == nil && !ok {
				err = errors.New("nacked")
			}
		}
		cancel()
		if err != nil {
			e.t.Fatalf("dead letter %s: %v", l.id, err)
		}
	}
	waitFor(e.t, 10*time.Second, "the letters in the DLQ", func() bool { return e.ready(dlq.Queue(prefix)) >= len(letters) })
}

// sampleLetters are six dead letters of four kinds, the ids unique to the
// test; hello is poison that is not even JSON, and one body is not text.
func (e *env) sampleLetters() []letter {
	id := func(s string) string { return s + "_" + e.name }
	return []letter{
		{id("hello"), "poison", "not a JSON event: invalid character 'h'", []byte("hello")},
		{id("binary"), "poison", "not a JSON event: invalid character", []byte{0xff, 0x00, '\n', 0xfe, '"'}},
		{id("conflict"), "producer-conflict", "event applied before with other content", []byte(`{"eventId":"c"}`)},
		{id("big1"), "data-rejected", "numeric field overflow (22003)", []byte(`{"eventId":"b1"}`)},
		{id("big2"), "data-rejected", "numeric field overflow (22003)", []byte(`{"eventId":"b2"}`)},
		{id("early"), "invalid-transition", "TransferSettled before TransferCreated", []byte(`{"eventId":"t"}`)},
	}
}

// dlqIDs returns the message ids in the DLQ, each with its count, looked at
// as a person does in the UI (requeueing).
func (e *env) dlqIDs() map[string]int {
	e.t.Helper()
	out := map[string]int{}
	for _, m := range e.peekDLQ() {
		id, _ := m.Properties["message_id"].(string)
		out[id]++
	}
	return out
}

// command runs the binary with args on the test's vhost, stdin as given
// (nil: /dev/null), and returns its stdout and stderr apart.
func (e *env) command(stdin *os.File, extra []string, args ...string) (stdout, stderr string, err error) {
	e.t.Helper()
	c := exec.Command(buildService(e.t), args...)
	c.Env = append(os.Environ(), e.commandEnv(2, extra...)...)
	if stdin != nil {
		c.Stdin = stdin
	}
	var out, errOut bytes.Buffer
	c.Stdout, c.Stderr = &out, &errOut
	err = c.Run()
	return out.String(), errOut.String(), err
}

// readRecords reads a record file, one dlq.Record a line, with the reader
// the package offers for it.
func readRecords(t *testing.T, r io.Reader) []dlq.Record {
	t.Helper()
	out, err := dlq.ReadRecords(r)
	if err != nil {
		t.Fatalf("the record file does not read back: %v", err)
	}
	return out
}

func readRecordFile(t *testing.T, name string) []dlq.Record {
	t.Helper()
	f, err := os.Open(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return readRecords(t, f)
}

// checkRecords fails unless records hold exactly the letters want, each
// with its body byte for byte, its failure headers and its properties.
func checkRecords(t *testing.T, records []dlq.Record, want []letter) {
	t.Helper()
	byID := map[string]dlq.Record{}
	for _, r := range records {
		if _, dup := byID[r.MessageID]; dup {
			t.Errorf("letter %s recorded twice", r.MessageID)
		}
		byID[r.MessageID] = r
	}
	if len(records) != len(want) {
		t.Errorf("%d records, want %d: %v", len(records), len(want), byID)
	}
	for _, l := range want {
		r, ok := byID[l.id]
		if !ok {
			t.Errorf("letter %s dropped without a record", l.id)
			continue
		}
		if !bytes.Equal(r.Body, l.body) {
			t.Errorf("letter %s recorded with body %q, want %q", l.id, r.Body, l.body)
		}
		if r.Headers[dlq.HeaderClass] != l.class || r.Headers[dlq.HeaderReason] != l.reason || r.Headers["producer"] != "test" ||
			r.Class != l.class || r.Queue != dlq.Queue(prefix) {
			t.Errorf("letter %s recorded with class %q and headers %v", l.id, r.Class, r.Headers)
		}
		if r.ContentType != "application/json" || r.Timestamp == nil || r.Timestamp.IsZero() ||
			!strings.HasPrefix(r.RoutingKey, "acc_") || r.Exchange != dlq.Exchange(prefix) || r.DroppedAt.IsZero() {
			t.Errorf("letter %s recorded without its properties: %+v", l.id, r)
		}
	}
}

// Each drop writes exactly the letters it removes, whole, before removing
// them; the filters take the right ones and leave the rest where they were.
func TestDLQDropRecordsExactlyWhatItRemoves(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(2)
	letters := e.sampleLetters()
	e.deadLetters(letters...)
	record := filepath.Join(t.TempDir(), "dropped.jsonl")

	out, errOut, err := e.command(nil, nil, "dlq", "drop", "--class", "poison", "--record", record, "--yes")
	if err != nil || !strings.Contains(out, "scanned 6 of the 6 dead letter(s)") || !strings.Contains(out, "dropped 2") {
		t.Fatalf("drop --class poison: %v\n%s%s", err, out, errOut)
	}
	checkRecords(t, readRecordFile(t, record), letters[:2])
	if fi, err := os.Stat(record); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("record file: %v, %v; want it readable by its owner alone", fi.Mode(), err)
	}
	left := e.dlqIDs()
	if len(left) != 4 || left[letters[0].id]+left[letters[1].id] != 0 {
		t.Errorf("DLQ after dropping the poison: %v, want the 4 others", left)
	}

	// --reason and --limit: one of the two overflows; appended to the record.
	out, errOut, err = e.command(nil, nil, "dlq", "drop", "--reason", "overflow", "--limit", "1", "--record", record, "--yes")
	if err != nil || !strings.Contains(out, "dropped 1") {
		t.Fatalf("drop --reason overflow --limit 1: %v\n%s%s", err, out, errOut)
	}
	records := readRecordFile(t, record)
	if len(records) != 3 {
		t.Fatalf("%d records after the second drop, want 3 (appended)", len(records))
	}
	gone := records[2].MessageID
	if gone != letters[3].id && gone != letters[4].id {
		t.Fatalf("--reason overflow dropped %s", gone)
	}
	dropped := append(append([]letter(nil), letters[:2]...), letters[3])
	if gone == letters[4].id {
		dropped[2] = letters[4]
	}
	checkRecords(t, records, dropped)

	// --event-id, recorded on stdout: the records alone there, the report
	// on stderr.
	out, errOut, err = e.command(nil, nil, "dlq", "drop", "--event-id", letters[2].id, "--record", "-", "--yes")
	if err != nil || !strings.Contains(errOut, "dropped 1") || !strings.Contains(errOut, "recorded in stdout") {
		t.Fatalf("drop --event-id --record -: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	checkRecords(t, readRecords(t, strings.NewReader(out)), letters[2:3])

	left = e.dlqIDs()
	want := map[string]int{letters[5].id: 1}
	for _, l := range letters[3:5] {
		if l.id != gone {
			want[l.id] = 1
		}
	}
	if fmt.Sprint(left) != fmt.Sprint(want) {
		t.Errorf("DLQ at the end: %v, want %v", left, want)
	}
}

// A dry run needs no record, writes none, and leaves every letter.
func TestDLQDropDryRunChangesNothing(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(2)
	letters := e.sampleLetters()
	e.deadLetters(letters...)
	before := e.dlqIDs()
	record := filepath.Join(t.TempDir(), "dropped.jsonl")
	for _, args := range [][]string{
		{"dlq", "drop", "--dry-run"},
		{"dlq", "drop", "--dry-run", "--record", record},
		{"dlq", "drop", "--dry-run", "--class", "data-rejected"},
	} {
		out, errOut, err := e.command(nil, nil, args...)
		if err != nil || !strings.Contains(out, "would drop") {
			t.Fatalf("%v: %v\n%s%s", args, err, out, errOut)
		}
		if n := len(letters); args[len(args)-1] == "--dry-run" && !strings.Contains(out, fmt.Sprintf("would drop %d", n)) {
			t.Errorf("%v does not offer all %d letters:\n%s", args, n, out)
		}
	}
	if _, err := os.Stat(record); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a dry run made the record file: %v", err)
	}
	if after := e.dlqIDs(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("DLQ after dry runs: %v, before %v", after, before)
	}
}

// A record that cannot be written removes nothing: a path that cannot be
// created, a device that refuses every write (/dev/full), and a record that
// fails midway, after which the letters not yet recorded all stay.
func TestDLQDropRemovesNothingUnrecorded(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(2)
	letters := e.sampleLetters()
	e.deadLetters(letters...)
	before := e.dlqIDs()
	for _, record := range []string{filepath.Join(t.TempDir(), "no", "such", "dir", "r.jsonl"), t.TempDir(), "/dev/full"} {
		out, errOut, err := e.command(nil, nil, "dlq", "drop", "--record", record, "--yes")
		if err == nil || strings.Contains(out, "dropped") && !strings.Contains(out, "dropped 0") {
			t.Errorf("drop --record %s: %v\n%s%s", record, err, out, errOut)
		}
		if !strings.Contains(errOut, "record") {
			t.Errorf("drop --record %s does not say the record failed:\n%s", record, errOut)
		}
		if after := e.dlqIDs(); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("drop --record %s removed letters: %v, before %v", record, after, before)
		}
	}

	// Midway: the third record fails.
	conn, err := amqp.DialConfig(e.amqpURL, amqp.Config{Properties: amqp.Table{"connection_name": e.name + "-drop"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var buf bytes.Buffer
	rec := &failingRecorder{Lines: dlq.Lines{W: &buf, Queue: dlq.Queue(prefix)}, after: 2}
	r, err := dlq.Drop(conn, prefix, dlq.Filter{}, 0, false, rec)
	if err == nil || !strings.Contains(err.Error(), "left in the DLQ") || len(r.Dropped) != 2 {
		t.Fatalf("drop with a record failing at the third letter = %d dropped, %v", len(r.Dropped), err)
	}
	records := readRecords(t, &buf)
	after := e.dlqIDs()
	if len(records) != 2 || len(after) != len(letters)-2 {
		t.Fatalf("%d recorded, DLQ %v; want 2 recorded and the %d others in the DLQ", len(records), after, len(letters)-2)
	}
	for _, r := range records {
		if after[r.MessageID] != 0 {
			t.Errorf("%s recorded and still in the DLQ", r.MessageID)
		}
	}
}

// failingRecorder records the first `after` letters and fails on the next.
type failingRecorder struct {
	dlq.Lines
	after, n int
}

func (f *failingRecorder) Record(d amqp.Delivery, l dlq.Letter) error {
	if f.n++; f.n > f.after {
		return errors.New("disk full")
	}
	return f.Lines.Record(d, l)
}

// Without --yes, drop asks on the terminal: "no" (or anything but yes or
// y) drops nothing, "y" drops. Without a terminal it refuses and says to
// pass --yes: stdin closed, and stdin a pipe even when it says yes.
func TestDLQDropAsksBeforeDropping(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(2)
	letters := e.sampleLetters()
	e.deadLetters(letters...)
	before := e.dlqIDs()
	record := filepath.Join(t.TempDir(), "dropped.jsonl")
	args := []string{"dlq", "drop", "--class", "data-rejected", "--record", record}

	for _, answer := range []string{"no\n", "yess\n", "\n"} {
		out, errOut, err := e.command(typed(t, answer), nil, args...)
		if err != nil || !strings.Contains(out, "Drop these 2 letter(s) from transfers.dlq for good") ||
			!strings.Contains(out, "nothing dropped") {
			t.Errorf("answer %q: %v\n%s%s", answer, err, out, errOut)
		}
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	w.WriteString("yes\n")
	w.Close()
	for name, stdin := range map[string]*os.File{"stdin closed": nil, "stdin a pipe": r} {
		out, errOut, err := e.command(stdin, nil, args...)
		if err == nil || !strings.Contains(errOut, "pass --yes") {
			t.Errorf("%s: %v, want a refusal that says to pass --yes\n%s%s", name, err, out, errOut)
		}
	}
	r.Close()
	if len(readRecordFile(t, record)) != 0 {
		t.Error("records written though nothing was to be dropped")
	}
	if after := e.dlqIDs(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("letters removed without a yes: %v, before %v", after, before)
	}

	out, errOut, err := e.command(typed(t, "y\n"), nil, args...)
	if err != nil || !strings.Contains(out, "dropped 2") {
		t.Fatalf("answer y: %v\n%s%s", err, out, errOut)
	}
	checkRecords(t, readRecordFile(t, record), letters[3:5])
	if after := e.dlqIDs(); len(after) != 4 || after[letters[3].id]+after[letters[4].id] != 0 {
		t.Errorf("DLQ after the yes: %v, want the 4 others", after)
	}
}

// typed returns the terminal end of a new pseudo-terminal with answer
// already typed on it, as a person at a terminal does.
func typed(t *testing.T, answer string) *os.File {
	t.Helper()
	master, term := newPTY(t)
	if _, err := master.WriteString(answer); err != nil {
		t.Fatal(err)
	}
	return term
}

// newPTY returns the two ends of a new pseudo-terminal, closed when the
// test ends: master is the side a terminal emulator holds, term the side a
// program reads and writes as its terminal.
func newPTY(t *testing.T) (master, term *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { master.Close() })
	var unlock int32
	if err := ioctl(master, syscall.TIOCSPTLCK, unsafe.Pointer(&unlock)); err != nil {
		t.Fatalf("unlock the pseudo-terminal: %v", err)
	}
	var n uint32
	if err := ioctl(master, syscall.TIOCGPTN, unsafe.Pointer(&n)); err != nil {
		t.Fatalf("name the pseudo-terminal: %v", err)
	}
	term, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { term.Close() })
	return master, term
}

func ioctl(f *os.File, req uintptr, arg unsafe.Pointer) error {
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), req, uintptr(arg)); errno != 0 {
		return errno
	}
	return nil
}

// An unfiltered replay leaves alone the letters that cannot apply again
// (poison, producer-conflict), says so and how to replay them, and replays
// the rest; named with --class, they are replayed.
func TestReplayLeavesAloneWhatCannotApplyAgain(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(2)
	letters := e.sampleLetters()
	e.deadLetters(letters...)

	out, errOut, err := e.command(nil, nil, "dlq", "replay", "--dry-run")
	if err != nil || !strings.Contains(out, "would replay 3") ||
		!strings.Contains(out, "left alone: 2 poison, 1 producer-conflict") ||
		!strings.Contains(out, "name --class poison or --class producer-conflict to replay them") {
		t.Fatalf("dlq replay --dry-run: %v\n%s%s", err, out, errOut)
	}
	for _, l := range letters[:3] {
		if strings.Contains(out, l.id) {
			t.Errorf("the dry run offers %s (%s):\n%s", l.id, l.class, out)
		}
	}
	out, errOut, err = e.command(nil, nil, "dlq", "replay", "--class", "poison", "--dry-run")
	if err != nil || !strings.Contains(out, "would replay 2") || !strings.Contains(out, letters[0].id) || strings.Contains(out, "left alone") {
		t.Errorf("dlq replay --class poison --dry-run: %v\n%s%s", err, out, errOut)
	}

	out, errOut, err = e.command(nil, nil, "dlq", "replay")
	if err != nil || !strings.Contains(out, "replayed 3") || !strings.Contains(out, "left alone: 2 poison, 1 producer-conflict") {
		t.Fatalf("dlq replay: %v\n%s%s", err, out, errOut)
	}
	left := e.dlqIDs()
	want := map[string]int{letters[0].id: 1, letters[1].id: 1, letters[2].id: 1}
	if fmt.Sprint(left) != fmt.Sprint(want) {
		t.Errorf("DLQ after the replay: %v, want the poison and the conflict", left)
	}
	if n := e.ready(e.topology(2).Queue(0)) + e.ready(e.topology(2).Queue(1)); n != 3 {
		t.Errorf("the partition queues hold %d, want the 3 replayed", n)
	}
}

// `dlq drop` as a user with exactly the README's permissions for it; with
// read on the DLQ taken away it is refused and drops nothing.
func TestDLQDropWithTheREADMEsLeastPermissions(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(2)
	letters := e.sampleLetters()
	e.deadLetters(letters...)
	least := readmeGrants(t)["`transferconsumer dlq drop`"]
	if least.configure == "" || least.write == "" || least.read == "" {
		t.Fatalf("README's table of permissions has no whole row for `transferconsumer dlq drop`: %+v", least)
	}
	record := filepath.Join(t.TempDir(), "dropped.jsonl")

	less := least
	less.read = "^$"
	out, errOut, err := e.command(nil, []string{"AMQP_URL=" + e.brokerUser("less", less, "")},
		"dlq", "drop", "--class", "poison", "--record", record, "--yes")
	if err == nil || !strings.Contains(errOut, "403") {
		t.Errorf("drop without read on the DLQ: %v, want refused (403)\n%s%s", err, out, errOut)
	}
	if len(readRecordFile(t, record)) != 0 || len(e.dlqIDs()) != len(letters) {
		t.Fatal("a refused drop recorded or removed letters")
	}

	out, errOut, err = e.command(nil, []string{"AMQP_URL=" + e.brokerUser("drop", least, "")},
		"dlq", "drop", "--class", "poison", "--record", record, "--yes")
	if err != nil || !strings.Contains(out, "dropped 2") {
		t.Fatalf("drop with the README's permissions: %v\n%s%s", err, out, errOut)
	}
	checkRecords(t, readRecordFile(t, record), letters[:2])
	if left := e.dlqIDs(); len(left) != len(letters)-2 {
		t.Errorf("DLQ after the drop: %v", left)
	}
}
