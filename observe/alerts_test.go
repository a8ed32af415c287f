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

// The alert rules load, and each fires where its unit test says and only
// there (promtool, from Debian's prometheus package; TEST_PROMTOOL names
// another). Without promtool this skips, except with CI=true.
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
	// The names every collector describes: a scrape of an idle service
	// would lack the series that exist only for a blocked queue.
	m := NewMetrics(&Health{}, config.Config{QueueCount: 8})
	descs := make(chan *prometheus.Desc, 1000)
	for _, c := range m.collectors {
		c.Describe(descs)
	}
	close(descs)
	var exported []string
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range descs {
		if n := fqName.FindStringSubmatch(d.String()); n != nil {
			exported = append(exported, n[1])
		}
	}
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
