package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"transferconsumer/config"
	"transferconsumer/reconcile"
)

// reconcile's flags are checked before the configuration, the database or
// the broker: a wrong one fails (exit 1, as for every command) with the
// usage, and --help prints it and succeeds.
func TestReconcileArgumentsBeforeConnecting(t *testing.T) {
	noBroker(t)
	tests := []struct {
		args []string
		want string // "" for success
	}{
		{[]string{"reconcile", "--help"}, ""},
		{[]string{"reconcile", "-n", "-1"}, "-n must not be negative"},
		{[]string{"reconcile", "--skip-dlq", "--require-dlq"}, "contradict"},
		{[]string{"reconcile", "--periodic", "--rebuild"}, "contradict"},
		{[]string{"reconcile", "extra"}, "takes no arguments"},
		{[]string{"reconcile", "--frobnicate"}, "flag provided but not defined"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var stdout bytes.Buffer
			err := run(t.Context(), tt.args, &stdout, &stdout)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("exit with %v, want 0", err)
			case tt.want == "" && !strings.Contains(stdout.String(), "Exit status: 0 when nothing was found, 3"):
				t.Errorf("no usage:\n%s", stdout.String())
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "Usage:")):
				t.Errorf("got %v, want %q and the usage", err, tt.want)
			case tt.want != "" && Found(err):
				t.Errorf("a wrong flag would exit %d, want 1", ExitFound)
			}
		})
	}
}

func TestReconcileSettingsAreChecked(t *testing.T) {
	for _, tt := range []struct{ name, value, want string }{
		{"RECONCILE_INTERVAL", "-1s", "must not be negative"},
		{"RECONCILE_WINDOW", "0s", "must be positive"},
		{"RECONCILE_PENDING_AFTER", "-5m", "must be positive"},
		{"RECONCILE_DLQ", "maybe", "true or false"},
		{"RECONCILE_FULL_INTERVAL", "-1h", "must not be negative"},
		{"RECONCILE_DATABASE_URL", "standby:5432", "RECONCILE_DATABASE_URL"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(tt.name, tt.value)
			_, err := config.Load()
			if err == nil || !strings.Contains(err.Error(), tt.name) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%s=%s: %v, want an error naming it, %q", tt.name, tt.value, err, tt.want)
			}
		})
	}
	t.Setenv("RECONCILE_INTERVAL", "0")
	if c, err := config.Load(); err != nil || c.ReconcileEvery != 0 {
		t.Errorf("RECONCILE_INTERVAL=0 (off): %v, %v", c.ReconcileEvery, err)
	}
}

// Each kind of finding counts once towards exit status 3, and the report
// names it, for a person and for a machine; nothing found is exit 0.
func TestReconcileReportAndStatus(t *testing.T) {
	actual := int64(150)
	at := time.Date(2026, 12, 1, 7, 0, 0, 0, time.UTC)
	found := reconcileReport{
		Reconciliation: reconcile.Reconciliation{Ran: true, At: at, Transfers: 3, Accounts: 2,
			Drift:      []reconcile.Drift{{Account: "acc_b", Expected: 100, Actual: &actual, Difference: 50}, {Account: "acc_c", Expected: -5, Difference: 5}},
			DriftCount: 7,
			Duplicates: []reconcile.Duplicate{{From: "acc_a", To: "acc_b", Amount: 700, Currency: "EUR", Transfer: "t2", CreatedAt: at, Earlier: "t1", EarlierAt: at.Add(-3 * time.Second)}},
			DupCount:   1},
		Window: time.Hour, After: time.Hour, InboxTTL: 720 * time.Hour,
		DeadLetters: deadLetters{Read: true, Total: 4, Old: 1, Letters: []deadLetter{{EventID: "e1", Class: "poison"}}},
	}
	if n := found.findings(); n != 3 {
		t.Errorf("%d kinds of finding, want 3 (drift, duplicates, old letters)", n)
	}
	var text bytes.Buffer
	printReconcile(&text, found)
	for _, want := range []string{"7 account(s) in drift", "(the first 2)", "acc_b", "+50", "no balance row",
		"t2", "t1", "3s", "1 suspected", "1 of 4 (1 older, 0 undated)", "e1", "found: drift, duplicate intents, old dead letters (exit status 3)"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, text.String())
		}
	}
	var js bytes.Buffer
	if err := printReconcileJSON(&js, found); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Clean bool `json:"clean"`
		Drift struct {
			Count int `json:"count"`
			Items []struct {
				Actual *int64 `json:"actual"`
			} `json:"items"`
		} `json:"drift"`
		Waiting struct {
			Items []any `json:"items"`
		} `json:"waiting_transitions"`
	}
	if err := json.Unmarshal(js.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.Clean || got.Drift.Count != 7 || len(got.Drift.Items) != 2 || got.Drift.Items[1].Actual != nil || got.Waiting.Items == nil {
		t.Errorf("JSON %s", js.String())
	}

	clean := reconcileReport{Reconciliation: reconcile.Reconciliation{Ran: true, At: at}, DeadLetters: deadLetters{Error: "not read: --skip-dlq"}}
	text.Reset()
	printReconcile(&text, clean)
	if clean.findings() != 0 || strings.Contains(text.String(), "found:") || !strings.Contains(text.String(), "not read: --skip-dlq") {
		t.Errorf("a clean report:\n%s", text.String())
	}
}

// The service's periodic run, with DECLARE_TOPOLOGY=false and no
// MANAGEMENT_URL, cannot check the DLQ's delivery limit without a declare
// that a least-permission user is refused (a channel error in the broker's
// log at every run): it does not connect to the broker at all, and says
// why. The reconcile command, run by a person, still connects, checks what
// it can and warns.
func TestPeriodicReconcileReadsNoDLQItCannotCheckQuietly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dials := make(chan struct{}, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dials <- struct{}{}
			c.Close()
		}
	}()
	t.Setenv("AMQP_URL", "amqp://guest:guest@"+ln.Addr().String()+"/")
	t.Setenv("DECLARE_TOPOLOGY", "false")
	t.Setenv("MANAGEMENT_URL", "")
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	d := readDeadLetters(cfg, 10, 0, true)
	if d.Read || !strings.Contains(d.Error, "MANAGEMENT_URL") {
		t.Errorf("periodic run: %+v, want not read, naming MANAGEMENT_URL", d)
	}
	if len(dials) != 0 {
		t.Errorf("the periodic run connected to the broker %d times", len(dials))
	}
	d = readDeadLetters(cfg, 10, 0, false)
	if d.Read || d.Error == "" {
		t.Errorf("command: %+v, want a failed read", d)
	}
	select {
	case <-dials:
	case <-time.After(10 * time.Second):
		t.Errorf("the reconcile command did not try the broker")
	}
}

// A periodic pass's report says it is one, from which cut-off, and since
// when each finding has been reported; a full pass's names the accounts
// whose transfers changed since the checkpoint, which count as a finding.
func TestReconcileReportOfEachPass(t *testing.T) {
	at := time.Date(2026, 12, 1, 7, 0, 0, 0, time.UTC)
	cut, seen := at.Add(-time.Hour), at.Add(-3*time.Hour)
	actual := int64(9)
	periodic := reconcileReport{
		Reconciliation: reconcile.Reconciliation{Ran: true, Recorded: true, At: at, Transfers: 12, Accounts: 30,
			Checkpoint: reconcile.Checkpoint{Present: true, WrittenAt: &cut},
			Drift:      []reconcile.Drift{{Account: "acc_q", Expected: 10, Actual: &actual, Difference: -1, FirstSeen: &seen}}, DriftCount: 1},
		Window: time.Hour, After: time.Hour, InboxTTL: 720 * time.Hour, DeadLetters: deadLetters{Error: "not read: --skip-dlq"},
	}
	var text bytes.Buffer
	printReconcile(&text, periodic)
	for _, want := range []string{"periodic pass", "12 transfers created or failed since the checkpoint", "30 accounts compared",
		"from its cut-off of 2026-12-01T06:00:00Z", "FIRST SEEN", "2026-12-01T04:00:00Z", "acc_q"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("the periodic report lacks %q:\n%s", want, text.String())
		}
	}
	checkpoint := int64(100)
	made := at.Add(-48 * time.Hour)
	full := reconcileReport{
		Reconciliation: reconcile.Reconciliation{Ran: true, Full: true, At: at,
			Checkpoint: reconcile.Checkpoint{Present: true, Compared: true, Differs: 1, WrittenAt: &cut},
			Drift:      []reconcile.Drift{{Account: "acc_q", Expected: 10, Actual: &actual, Difference: -1}}, DriftCount: 1,
			Changed: []reconcile.Changed{{Account: "acc_p", Transfers: 5, Checkpoint: &checkpoint, Difference: 95, CheckpointMadeAt: &made, FirstSeen: &seen},
				{Account: "acc_r", Transfers: 90, Checkpoint: &checkpoint, Difference: 10, CheckpointMadeAt: &made}}, ChangedCount: 2},
		DeadLetters: deadLetters{Error: "not read: --skip-dlq"},
	}
	if n := full.findings(); n != 2 {
		t.Errorf("%d kinds of finding, want 2 (drift, transfers changed)", n)
	}
	text.Reset()
	printReconcile(&text, full)
	for _, want := range []string{"full pass", "1 account(s) whose transfers changed since its cut-off", "acc_r", "+10",
		"2026-11-29T07:00:00Z", "acc_p", "2026-12-01T04:00:00Z", "this pass (not written down", "INSERT INTO reconcile_resolved",
		"found: drift, transfers changed (exit status 3)"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("the full report lacks %q:\n%s", want, text.String())
		}
	}
	for _, line := range strings.Split(text.String(), "\n") {
		if strings.Contains(line, "EXPECTED") && strings.Contains(line, "FIRST SEEN") {
			t.Errorf("a pass that wrote nothing down says since when a drift was seen:\n%s", text.String())
		}
	}
}

// Whatever a run holds, its log has at most logFirst lines of each kind
// of finding and one line saying how many of the kind it left out; the
// summary counts them all. The standby's full pass holds up to
// recordFirst of each kind, to write them down on the primary.
func TestEveryLogOfFindingsIsBounded(t *testing.T) {
	const held, count = 250, 400
	at := time.Date(2026, 12, 1, 7, 0, 0, 0, time.UTC)
	rep := reconcileReport{Reconciliation: reconcile.Reconciliation{Ran: true, Full: true, At: at,
		DriftCount: count, ChangedCount: count, DupCount: count, WaitCount: count},
		DeadLetters: deadLetters{Read: true, Total: count, Old: count}}
	for i := range held {
		rep.Drift = append(rep.Drift, reconcile.Drift{Account: fmt.Sprint("acc_", i), Difference: 1})
		rep.Changed = append(rep.Changed, reconcile.Changed{Account: fmt.Sprint("acc_", i), Difference: 1})
		rep.Duplicates = append(rep.Duplicates, reconcile.Duplicate{Transfer: fmt.Sprint("t", i), CreatedAt: at, EarlierAt: at})
		rep.Waiting = append(rep.Waiting, reconcile.Waiting{Transfer: fmt.Sprint("w", i), ReceivedAt: at})
		rep.DeadLetters.Letters = append(rep.DeadLetters.Letters, deadLetter{EventID: fmt.Sprint("e", i)})
	}
	var buf bytes.Buffer
	logReconcile(slog.New(slog.NewJSONHandler(&buf, nil)), rep)
	lines := map[string]int{}
	leftOut := map[string]float64{}
	var summary map[string]any
	for _, raw := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var l map[string]any
		if err := json.Unmarshal([]byte(raw), &l); err != nil {
			t.Fatal(err)
		}
		msg := fmt.Sprint(l["msg"])
		lines[msg]++
		switch msg {
		case "reconcile: findings left out of the log":
			leftOut[fmt.Sprint(l["kind"])] = l["left_out"].(float64)
		case "reconciled":
			summary = l
		}
	}
	for _, msg := range []string{"reconcile: balance drift", "reconcile: transfers changed since the checkpoint", "reconcile: suspected duplicate intent",
		"reconcile: transition waiting for its creation", "reconcile: dead letter the inbox can no longer prove harmless to replay"} {
		if lines[msg] != logFirst {
			t.Errorf("%d lines %q, want %d", lines[msg], msg, logFirst)
		}
	}
	for _, kind := range []string{"drift", "changed", "duplicate", "waiting", "old_dead_letter"} {
		if leftOut[kind] != count-logFirst {
			t.Errorf("left out of the log, %s: %v; want %d", kind, leftOut[kind], count-logFirst)
		}
	}
	for _, key := range []string{"drift", "changed_since_checkpoint", "duplicate_intents", "waiting_transitions", "old_dead_letters"} {
		if summary[key] != float64(count) {
			t.Errorf("the summary's %s: %v, want %d", key, summary[key], count)
		}
	}
	if n := strings.Count(buf.String(), "\n"); n > 5*(logFirst+1)+1 {
		t.Errorf("%d lines logged, want at most %d", n, 5*(logFirst+1)+1)
	}
}
