package observe

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"sigs.k8s.io/yaml"
)

// rule is what the tests read of an alert rule.
type rule struct {
	Alert       string            `json:"alert"`
	Annotations map[string]string `json:"annotations"`
}

// alertRules reads prometheus/alerts.yml's rules.
func alertRules(t *testing.T) []rule {
	t.Helper()
	raw, err := os.ReadFile("../prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Rules []rule `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	var out []rule
	for _, g := range file.Groups {
		out = append(out, g.Rules...)
	}
	if len(out) == 0 {
		t.Fatal("prometheus/alerts.yml has no rule")
	}
	return out
}

// runbookFile is where each rule's runbook_url points, from the
// repository's root.
const runbookFile = "prometheus/runbook.md"

// Every alert has a runbook_url that resolves to a section of
// prometheus/runbook.md, by the anchor GitHub gives its heading; each
// section says what the alert means, how to confirm it and what to do,
// the dashboard panels it names exist, and no section is left for an
// alert that is gone. Summaries are short phrases; descriptions are
// templated with the alert's labels or value.
func TestEveryAlertHasARunbookSection(t *testing.T) {
	raw, err := os.ReadFile("../" + runbookFile)
	if err != nil {
		t.Fatal(err)
	}
	sections := runbookSections(string(raw))
	rules := alertRules(t)
	var alerts []string
	for _, r := range rules {
		alerts = append(alerts, r.Alert)
		file, anchor, ok := strings.Cut(r.Annotations["runbook_url"], "#")
		switch {
		case !ok || file != runbookFile:
			t.Errorf("%s: runbook_url %q is not %s#<section>", r.Alert, r.Annotations["runbook_url"], runbookFile)
			continue
		case sections[anchor] == nil:
			t.Errorf("%s: runbook_url's anchor #%s is no heading of %s", r.Alert, anchor, runbookFile)
			continue
		}
		s := sections[anchor]
		if s.heading != r.Alert {
			t.Errorf("%s: runbook_url leads to the section %q", r.Alert, s.heading)
		}
		for _, part := range []string{"**Meaning.**", "**Confirm.**", "**Act.**"} {
			if !strings.Contains(s.text, part) {
				t.Errorf("%s: its runbook section has no %s", r.Alert, part)
			}
		}
		summary := r.Annotations["summary"]
		if summary == "" || len(summary) > 70 || strings.HasSuffix(summary, ".") || strings.Contains(summary, "{{") {
			t.Errorf("%s: summary %q: want a short phrase, without templates or a final period", r.Alert, summary)
		}
		if d := r.Annotations["description"]; !strings.Contains(d, "{{ $labels.") && !strings.Contains(d, "{{ $value") {
			t.Errorf("%s: description %q uses neither the alert's labels nor its value", r.Alert, d)
		}
	}
	for anchor, s := range sections {
		if s.level == 2 && !slices.Contains(alerts, s.heading) {
			t.Errorf("%s has a section %q (#%s) for no alert of prometheus/alerts.yml", runbookFile, s.heading, anchor)
		}
	}
	// Links inside the runbook to its own sections resolve too.
	for _, m := range regexp.MustCompile(`\]\(#([^)]+)\)`).FindAllStringSubmatch(string(raw), -1) {
		if sections[m[1]] == nil {
			t.Errorf("%s links to #%s, which is no heading of it", runbookFile, m[1])
		}
	}
	// The panels it names (in *italics*) are the dashboard's.
	titles := dashboardTitles(t)
	named := regexp.MustCompile(`(?:^|[^*])\*([^*]+)\*(?:[^*]|$)`).FindAllStringSubmatch(string(raw), -1)
	if len(named) < len(rules) {
		t.Errorf("%s names %d dashboard panels, want one at least for each of the %d alerts", runbookFile, len(named), len(rules))
	}
	for _, m := range named {
		title := strings.Join(strings.Fields(m[1]), " ") // a title may wrap
		if !slices.Contains(titles, title) {
			t.Errorf("%s names the panel *%s*, which prometheus/dashboard.json does not have", runbookFile, title)
		}
	}
}

// section is a heading of the runbook and the text under it.
type section struct {
	heading string
	level   int
	text    string
}

// runbookSections returns the markdown's sections by the anchor GitHub
// makes of each heading: lower case, punctuation other than hyphens and
// underscores dropped, spaces made hyphens, and -1, -2, … after a repeat.
// Lines in fenced code are no headings.
func runbookSections(md string) map[string]*section {
	out := map[string]*section{}
	var cur *section
	fenced := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		level := len(line) - len(strings.TrimLeft(line, "#"))
		if !fenced && level > 0 && level <= 6 && strings.HasPrefix(line[level:], " ") {
			heading := strings.TrimSpace(line[level:])
			anchor := githubAnchor(heading)
			base := anchor
			for n := 1; out[anchor] != nil; n++ {
				anchor = base + "-" + strconv.Itoa(n)
			}
			cur = &section{heading: heading, level: level}
			out[anchor] = cur
			continue
		}
		if cur != nil {
			cur.text += line + "\n"
		}
	}
	return out
}

// githubAnchor is the anchor GitHub gives a heading.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r), unicode.IsNumber(r), unicode.IsMark(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// The anchors are GitHub's.
func TestGitHubAnchor(t *testing.T) {
	for heading, want := range map[string]string{
		"TransferConsumerQueueBlocked":             "transferconsumerqueueblocked",
		"Runbook: transferconsumer's alerts":       "runbook-transferconsumers-alerts",
		"The journal: what a restore loses":        "the-journal-what-a-restore-loses",
		"RabbitMQ (rabbitmq_prometheus), 4.x only": "rabbitmq-rabbitmq_prometheus-4x-only",
	} {
		if got := githubAnchor(heading); got != want {
			t.Errorf("githubAnchor(%q) = %q, want %q", heading, got, want)
		}
	}
	s := runbookSections("# A\n\n## B\ntext\n```sh\n## not a heading\n```\n## B\n")
	if s["b"] == nil || s["b-1"] == nil || s["not-a-heading"] != nil || !strings.Contains(s["b"].text, "text") {
		t.Errorf("sections %v: want b, b-1 and no heading inside the fence", s)
	}
}

// dashboardTitles returns the titles of prometheus/dashboard.json's panels.
func dashboardTitles(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile("../prometheus/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct{ Title string }
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range d.Panels {
		out = append(out, p.Title)
	}
	return out
}
