package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"transferconsumer/config"
	"transferconsumer/dlq"
)

// Each run that changes the DLQ appends one line: who, when, its filter,
// what it did, and its error; a log that cannot be opened refuses the run,
// and a dry run records nothing.
func TestDLQAuditRecordsEachRun(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "audit.jsonl")
	a, err := parseDLQ([]string{"replay", "--group", "83461e1a2ae5", "--rate", "50", "--audit", name}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var say bytes.Buffer
	for i := 0; i < 2; i++ {
		l, err := openAudit(config.Config{}, a, &say)
		if err != nil || l == nil {
			t.Fatalf("openAudit: %v, %v", l, err)
		}
		r := dlq.ReplayReport{Run: "run1", Depth: 10, Scanned: 6, Published: 3, TooOld: 1,
			Replayed: []dlq.Letter{{EventID: "e1"}, {EventID: "e2"}}, Interrupted: true}
		var runErr error
		if i == 1 {
			runErr = errors.New("broker nacked the message")
		}
		if err := l.write(dlq.ReplayRun(r, "transfers.dlq"), a, nil, runErr); !errors.Is(err, runErr) {
			t.Errorf("write: %v, want the run's error %v", err, runErr)
		}
	}
	var runs []dlq.Run
	for _, line := range strings.Split(strings.TrimSpace(readAll(t, name)), "\n") {
		var run dlq.Run
		if err := jsonUnmarshal(line, &run); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		runs = append(runs, run)
	}
	if len(runs) != 2 {
		t.Fatalf("%d runs recorded, want 2", len(runs))
	}
	r := runs[0]
	if r.Command != "replay" || r.Run != "run1" || r.User == "" || r.Started.IsZero() || r.Ended.Before(r.Started) ||
		r.Filter.Group != "83461e1a2ae5" || r.Filter.Rate != 50 || r.Replayed != 3 || r.Confirmed != 2 || r.Skipped != 1 ||
		r.Left != 4 || strings.Join(r.EventIDs, ",") != "e1,e2" || !r.Interrupted || r.Error != "" {
		t.Errorf("run recorded as %+v", r)
	}
	if runs[1].Error != "broker nacked the message" {
		t.Errorf("the second run's error: %q", runs[1].Error)
	}
	if fi, err := os.Stat(name); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the log's mode: %v, %v; want 0600", fi.Mode(), err)
	}

	// Not openable: the run is refused before it touches the DLQ.
	a.audit = filepath.Join(dir, "missing", "audit.jsonl")
	if _, err := openAudit(config.Config{}, a, &say); err == nil || !strings.Contains(err.Error(), "nothing done") {
		t.Errorf("an audit log in a missing directory: %v, want a refusal", err)
	}
	// DLQ_AUDIT_LOG when --audit is not given; none at all is said.
	a.audit = ""
	if l, err := openAudit(config.Config{DLQAudit: name}, a, &say); err != nil || l == nil || l.f.Name() != name {
		t.Errorf("DLQ_AUDIT_LOG: %v, %v", l, err)
	}
	say.Reset()
	if l, err := openAudit(config.Config{}, a, &say); l != nil || err != nil || !strings.Contains(say.String(), "no audit record") {
		t.Errorf("no log: %v, %v, said %q", l, err, say.String())
	}
	a.dryRun = true
	if l, err := openAudit(config.Config{DLQAudit: name}, a, &say); l != nil || err != nil {
		t.Errorf("a dry run: %v, %v; want no log", l, err)
	}
}

func readAll(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func jsonUnmarshal(line string, v any) error { return json.Unmarshal([]byte(line), v) }
