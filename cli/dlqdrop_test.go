package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"

	"transferconsumer/config"
	"transferconsumer/dlq"
)

// drop takes replay's filters, and needs a record unless it is a dry run.
func TestDLQDropParsesReplaysFiltersAndItsOwn(t *testing.T) {
	tests := []struct {
		args []string
		want dlqArgs
	}{
		{[]string{"drop", "--record", "r.jsonl"}, dlqArgs{cmd: "drop", record: "r.jsonl"}},
		{[]string{"drop", "--record", "-", "--yes"}, dlqArgs{cmd: "drop", record: "-", yes: true}},
		{[]string{"drop", "--dry-run"}, dlqArgs{cmd: "drop", dryRun: true}},
		{[]string{"drop", "--class", "poison", "--reason", "not JSON", "--event-id", "e1", "--limit", "2", "--record", "r"},
			dlqArgs{cmd: "drop", filter: dlq.Filter{Class: "poison", Reason: "not JSON", EventID: "e1"}, limit: 2, record: "r"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			got, err := parseDLQ(tt.args, nil)
			if err != nil || got != tt.want {
				t.Errorf("parseDLQ = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
	for _, class := range dlq.Classes() {
		if a, err := parseDLQ([]string{"drop", "--class", class, "--dry-run"}, nil); err != nil || a.filter.Class != class {
			t.Errorf("--class %s: %+v, %v", class, a, err)
		}
	}
}

// Only "yes" or "y", on a line of its own, confirms; a stdin that ends
// before any line is nobody answering, an error that says to pass --yes.
func TestDLQDropConfirmsOnlyOnYes(t *testing.T) {
	tests := []struct {
		input string
		yes   bool
		err   bool
	}{
		{"yes\n", true, false},
		{"y\n", true, false},
		{"  yes \r\n", true, false},
		{"yes", true, false}, // then end of input (Ctrl-D)
		{"no\n", false, false},
		{"n\n", false, false},
		{"\n", false, false},
		{"YES\n", false, false},
		{"yess\n", false, false},
		{"sure\n", false, false},
		{"no\nyes\n", false, false}, // one line is read
		{"", false, true},
	}
	for _, tt := range tests {
		t.Run(strings.TrimSpace(tt.input), func(t *testing.T) {
			var out bytes.Buffer
			yes, err := confirm(strings.NewReader(tt.input), &out, "Drop? ")
			if yes != tt.yes || (err != nil) != tt.err {
				t.Errorf("confirm(%q) = %v, %v; want %v, error %v", tt.input, yes, err, tt.yes, tt.err)
			}
			if err != nil && !strings.Contains(err.Error(), "pass --yes") {
				t.Errorf("the error does not say to pass --yes: %v", err)
			}
			if !strings.HasPrefix(out.String(), "Drop? ") {
				t.Errorf("the question was not asked: %q", out.String())
			}
		})
	}
	if _, err := confirm(iotest.ErrReader(os.ErrClosed), &bytes.Buffer{}, "Drop? "); err == nil {
		t.Error("a stdin that fails confirmed or declined without an error")
	}
}

// A pipe and a regular file are not a terminal to ask on; /dev/null is a
// character device, which confirm then reads as closed.
func TestDLQDropAsksOnlyATerminal(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if terminal(r) {
		t.Error("a pipe taken for a terminal")
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "answers"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if terminal(f) {
		t.Error("a regular file taken for a terminal")
	}
	if terminal(nil) {
		t.Error("no stdin taken for a terminal")
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	if terminal(null) {
		if _, err := confirm(null, &bytes.Buffer{}, "Drop? "); err == nil {
			t.Error("/dev/null answered")
		}
	}
}

// Without a terminal and without --yes, drop refuses before it opens the
// record file or connects.
func TestDLQDropWithoutATerminalRefusesBeforeAnything(t *testing.T) {
	noBroker(t)
	t.Setenv("QUEUE_COUNT", "1") // a configuration, with a broker nobody can reach
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w.WriteString("yes\n")
	w.Close()
	record := filepath.Join(t.TempDir(), "dropped.jsonl")
	var stdout, stderr bytes.Buffer
	err = dlqCommand(context.Background(), cfg, dlqArgs{cmd: "drop", record: record}, r, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "pass --yes") || !strings.Contains(err.Error(), "not a terminal") {
		t.Errorf("got %v, want a refusal that says to pass --yes", err)
	}
	if _, err := os.Stat(record); !os.IsNotExist(err) {
		t.Errorf("the record file was made: %v", err)
	}
	// An unwritable record fails before connecting too.
	err = dlqCommand(context.Background(), cfg, dlqArgs{cmd: "drop", record: filepath.Join(t.TempDir(), "no", "such", "dir"), yes: true},
		r, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "nothing dropped") || strings.Contains(err.Error(), "connect") {
		t.Errorf("got %v, want the record file's error before any connection", err)
	}
}
