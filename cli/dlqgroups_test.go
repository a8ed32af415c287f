package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"transferconsumer/dlq"
)

// list, replay and drop take --group, and refuse what is not a fingerprint.
func TestDLQParsesGroup(t *testing.T) {
	const g = "83461e1a2ae5"
	for _, args := range [][]string{
		{"list", "--group", g},
		{"replay", "--group", g},
		{"drop", "--group", g, "--dry-run"},
	} {
		a, err := parseDLQ(args, nil)
		if err != nil || a.filter.Group != g {
			t.Errorf("%v: %+v, %v; want group %s", args, a, err, g)
		}
	}
	for _, bad := range []string{"83461E1A2AE5", "83461e1a2ae", "poison", "83461e1a2ae5x"} {
		_, err := parseDLQ([]string{"replay", "--group", bad}, nil)
		if err == nil || !strings.Contains(err.Error(), "is not a group's fingerprint") {
			t.Errorf("--group %q: %v; want a refusal", bad, err)
		}
	}
}

// list prints one line per group: fingerprint, count, class, first and last
// failure, queues, letters replayed before, a sample reason.
func TestDLQListPrintsGroups(t *testing.T) {
	at := time.Date(2026, 7, 10, 12, 0, 0, 0, time.UTC)
	s := dlq.Summary{Total: 5, Matched: 5, Groups: []dlq.Group{
		{Fingerprint: "5419d742573a", Class: "invalid-transition", Count: 3, First: at, Last: at.Add(time.Hour),
			Queues: []string{"transfers.0", "transfers.1", "transfers.2", "transfers.3"}, Replayed: 2,
			Reason: "TransferCompleted for transfer 0c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33, which is already failed"},
		{Fingerprint: "83461e1a2ae5", Class: "poison", Count: 2, Queues: []string{"transfers.1"},
			Reason: "data.amountMinor 0 is not positive"},
	}}
	var out bytes.Buffer
	printSummary(&out, "transfers.dlq", s, dlq.Filter{})
	got := out.String()
	for _, want := range []string{
		"transfers.dlq: 5 dead letter(s), 2 group(s)\n",
		"GROUP", "COUNT", "CLASS", "FIRST FAILED", "LAST FAILED", "QUEUES", "REPLAYED BEFORE", "SAMPLE REASON",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("list does not say %q:\n%s", want, got)
		}
	}
	lines := strings.Split(got, "\n")
	var rows []string
	for _, l := range lines {
		if strings.HasPrefix(l, "5419d742573a") || strings.HasPrefix(l, "83461e1a2ae5") {
			rows = append(rows, strings.Join(strings.Fields(l), " "))
		}
	}
	want := []string{
		"5419d742573a 3 invalid-transition 2026-07-10T12:00:00Z 2026-07-10T13:00:00Z transfers.0,transfers.1,transfers.2 +1 2 " +
			"TransferCompleted for transfer 0c8a4c0e-2d37-4c61-8f0e-1e5d2b7a9e33, which is already failed",
		"83461e1a2ae5 2 poison - - transfers.1 0 data.amountMinor 0 is not positive",
	}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("group rows:\n%s\nwant:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}

	out.Reset()
	printSummary(&out, "transfers.dlq", dlq.Summary{Total: 5, Matched: 2, Groups: s.Groups[1:]}, dlq.Filter{Group: "83461e1a2ae5"})
	if !strings.HasPrefix(out.String(), "transfers.dlq: 5 dead letter(s), 2 in group 83461e1a2ae5, 1 group(s)\n") {
		t.Errorf("list --group:\n%s", out.String())
	}
}

// A letter's history shows beside it: how often it was replayed, when last.
func TestDLQLettersShowTheirReplays(t *testing.T) {
	at := time.Date(2026, 7, 10, 12, 0, 0, 0, time.UTC)
	var out bytes.Buffer
	printLetters(&out, []dlq.Letter{{EventID: "e1", Group: "5419d742573a", Class: "panic", Replays: 3, LastReplay: at}, {EventID: "e2"}})
	if got := out.String(); !strings.Contains(got, "REPLAYS") || !strings.Contains(got, "3, last 2026-07-10T12:00:00Z") {
		t.Errorf("letters:\n%s", got)
	}
}

// --rate takes N or N/s, 0 for no limit, and defaults to dlq.DefaultRate.
func TestDLQReplayParsesRate(t *testing.T) {
	for _, c := range []struct {
		args []string
		want float64
	}{
		{[]string{"replay"}, dlq.DefaultRate},
		{[]string{"replay", "--rate", "50"}, 50},
		{[]string{"replay", "--rate", "50/s"}, 50},
		{[]string{"replay", "--rate=2.5"}, 2.5},
		{[]string{"replay", "--rate", "0"}, 0},
	} {
		a, err := parseDLQ(c.args, nil)
		if err != nil || float64(a.rate) != c.want {
			t.Errorf("%v: rate %v, %v; want %v", c.args, a.rate, err, c.want)
		}
	}
	for _, bad := range []string{"-1", "fast", "50/min"} {
		if _, err := parseDLQ([]string{"replay", "--rate", bad}, nil); err == nil || !strings.Contains(err.Error(), "not a rate") {
			t.Errorf("--rate %s: %v, want a refusal", bad, err)
		}
	}
	if _, err := parseDLQ([]string{"drop", "--rate", "5", "--dry-run"}, nil); err == nil {
		t.Error("drop --rate: accepted, want a refusal (drop removes, it does not publish)")
	}
}

// The progress line says done, left and the rate.
func TestDLQReplayProgressText(t *testing.T) {
	got := progressText(dlq.Progress{Replayed: 100, Scanned: 250, Depth: 300, Elapsed: 2 * time.Second})
	if want := "replayed 100, 50 of 300 letter(s) left to read, 50.0/s"; !strings.HasPrefix(got, want) {
		t.Errorf("progress %q, want %q", got, want)
	}
}

// The progress line shows the first count at once and ends with the
// run's last.
func TestDLQReplayProgressEndsWithTheLastCount(t *testing.T) {
	var out bytes.Buffer
	p := &progressLine{w: &out}
	for i := 1; i <= 50; i++ {
		p.show(dlq.Progress{Replayed: i, Scanned: i, Depth: 50, Elapsed: time.Second})
	}
	p.end()
	got := out.String()
	if !strings.HasPrefix(got, "\rreplayed 1, 49 of 50") || !strings.Contains(got, "\rreplayed 50, 0 of 50") || !strings.HasSuffix(got, "\n") {
		t.Errorf("progress %q: want the first count, the last, and a new line", got)
	}
	var none bytes.Buffer
	(&progressLine{w: &none}).end()
	var nilLine *progressLine
	nilLine.end()
	if none.Len() != 0 {
		t.Errorf("a run that replayed nothing wrote %q", none.String())
	}
}
