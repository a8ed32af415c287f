package observe

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"transferconsumer/config"
)

// The alert rules load, each fires where its unit test says and only
// there, and prometheus.yml, which loads them, is valid (promtool, from
// Debian's prometheus package; TEST_PROMTOOL names another). Without
// promtool this skips, except with CI=true.
func TestAlertRules(t *testing.T) {
	promtool := os.Getenv("TEST_PROMTOOL")
	if promtool == "" {
		promtool = "promtool"
	}
	if _, err := exec.LookPath(promtool); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true but promtool is not here (Debian's prometheus package, or TEST_PROMTOOL): %v", err)
		}
		t.Skipf("no promtool (Debian's prometheus package, or TEST_PROMTOOL): %v", err)
	}
	for _, args := range [][]string{
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
		{"check", "config", "prometheus.yml"}, // the scrape configuration the README gives
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "../prometheus"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}

// Every series the alert rules read is one the service exports: a rule on
// a misspelt or renamed metric would never fire, and no unit test of the
// rules alone can tell.
func TestAlertRulesReadTheServicesMetrics(t *testing.T) {
	rules, err := os.ReadFile("../prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	exported := exportedSeries()
	used := regexp.MustCompile(`\btransferconsumer_[a-z_]+\b`).FindAllString(string(rules), -1)
	if len(used) == 0 {
		t.Fatal("the rules read no series of the service")
	}
	for _, name := range used {
		if !slices.Contains(exported, name) {
			t.Errorf("prometheus/alerts.yml reads %s, which the service does not export", name)
		}
	}
}

// Every series of the service the dashboard's panels and variables read
// is one it exports (a histogram's by its _bucket, _sum and _count):
// integration/dashboard_test.go evaluates each query against a real
// Prometheus, this says so at once, without one.
func TestTheDashboardReadsTheServicesMetrics(t *testing.T) {
	board, err := os.ReadFile("../prometheus/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	exported := exportedSeries()
	used := regexp.MustCompile(`\b(?:transferconsumer|go_sql)_[a-z_]+\b`).FindAllString(string(board), -1)
	if len(used) < 20 {
		t.Fatalf("the dashboard reads %d series of the service, want its panels' (at least 20)", len(used))
	}
	for _, name := range used {
		base := regexp.MustCompile(`_(bucket|sum|count)$`).ReplaceAllString(name, "")
		if !slices.Contains(exported, name) && !slices.Contains(exported, base) {
			t.Errorf("prometheus/dashboard.json reads %s, which the service does not export", name)
		}
	}
}

// exportedSeries returns the names every collector describes: a scrape
// of an idle service would lack the series that exist only for a blocked
// queue, or with the journal.
func exportedSeries() []string {
	m := NewMetrics(&Health{}, config.Config{QueueCount: 8, Prefix: "transfers", JournalStream: "transfers.journal"})
	descs := make(chan *prometheus.Desc, 1000)
	for _, c := range m.collectors {
		c.Describe(descs)
	}
	close(descs)
	var exported []string
	for d := range descs { // fqName: scrape_test.go
		if n := fqName.FindStringSubmatch(d.String()); n != nil {
			exported = append(exported, n[1])
		}
	}
	return exported
}
