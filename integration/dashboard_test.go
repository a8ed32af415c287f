package integration

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// The dashboard (prometheus/dashboard.json) against a real Prometheus
// (Debian's prometheus package, with prometheus/prometheus.yml and the
// alert rules), scraping the built service and the broker's
// rabbitmq_prometheus plugin for the test's vhost and the node's alarms,
// under a small load with one poison message and one queue blocked: a row
// lock the test holds makes each attempt of its event run into
// APPLY_TIMEOUT; the periodic reconciliation runs every 2 s. Every query
// of every panel, and every variable's, is evaluated through the HTTP
// API: each parses, each series it names is one Prometheus scraped from
// the service or the plugin, and the panels the load moves show it; each
// of the broker's alarms is found for the cluster serving the vhost (on
// or off: the test raises none, others may). Every alert rule evaluates
// without an error.
func TestTheDashboardAgainstARealPrometheus(t *testing.T) {
	parallel(t)
	bin := prometheusPath(t)
	rabbit := rabbitPrometheus(t)
	began := time.Now()
	e := newEnv(t)
	e.declare(2)
	proc := startProcess(t, e.serviceEnv(2, "INSTANCE_NAME="+e.name+"-svc", "APPLY_TIMEOUT=1s", "BATCH_MAX=5",
		"JOURNAL_STREAM="+prefix+".journal", "RECONCILE_INTERVAL=2s"))
	proc.waitConsuming(1)
	service := strings.TrimPrefix(proc.httpAddr(), "http://")
	t.Logf("%s: the service consumes", time.Since(began).Round(time.Millisecond))
	prom := startPrometheus(t, bin, service, rabbit, e.vhost)
	waitFor(t, 30*time.Second, "every target scraped", func() bool {
		up, err := prom.query(`up`)
		return err == nil && len(up) == 3 && !slices.ContainsFunc(up, func(s sample) bool { return s.value() != 1 })
	})

	// The load: events among a few accounts, one poison message, and the
	// events of one account whose balance row the test holds locked.
	blocked := "acc_blocked_" + e.name
	e.db.MustExec(`INSERT INTO balance_projection (account, balance_minor) VALUES ($1, 0)`, blocked)
	hold, err := e.db.Beginx()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hold.Rollback() }) // before the service is killed
	hold.MustExec(`SELECT 1 FROM balance_projection WHERE account = $1 FOR UPDATE`, blocked)
	e.publishMany(40, 6)
	e.publishRaw(prefix, "acc_poison_"+e.name, []byte(`{"eventId": "not json`), "")
	waitFor(t, 30*time.Second, "the poison dead-lettered", func() bool { return proc.count("outcome", "dead_lettered") == 1 })
	t.Logf("%s: Prometheus scrapes every target; the load is published", time.Since(began).Round(time.Millisecond))
	for i := 0; i < 12; i++ {
		e.publish(newTransfer(blocked, fmt.Sprintf("acc_%02d_%s", i%6, e.name), 1))
	}

	board := readDashboard(t)
	values := map[string]string{"instance": service, "queue": ".*", "vhost": e.vhost, "__rate_interval": "5m"}
	// The panels this load must move: each shows a value other than 0.
	moved := []string{"Events per second by queue and outcome", "Apply latency", "Batch size", "Blocked queues",
		"Blocked queues by reason", "Reconciliation checkpoint", "Retries in place by reason", "Dead-letter queue depth", "Dead letters by class", "Journal hold time",
		"Database and its standby", "Connection pool", "Statement timeouts", "Replicas", "Queues by instance",
		"Queue depth", "Consumers per queue"}
	for _, title := range moved {
		if !slices.ContainsFunc(board.panels, func(p boardPanel) bool { return p.title == title }) {
			t.Fatalf("the dashboard has no panel %q", title)
		}
	}
	shows := func(p boardPanel) bool {
		for _, expr := range p.exprs {
			if got, err := prom.query(substitute(expr, values)); err == nil && slices.ContainsFunc(got, func(s sample) bool {
				return s.value() != 0 && !math.IsNaN(s.value())
			}) {
				return true
			}
		}
		return false
	}
	said := ""
	waitFor(t, 60*time.Second, "every panel the load moves to show it (the last line above says which do not)", func() bool {
		var still []string
		for _, p := range board.panels {
			if slices.Contains(moved, p.title) && !shows(p) {
				still = append(still, p.title)
			}
		}
		if now := fmt.Sprint(still); len(still) > 0 && now != said {
			t.Logf("%s: no data yet in %s", time.Since(began).Round(time.Millisecond), now)
			said = now
		}
		return len(still) == 0
	})

	t.Logf("%s: every panel the load moves shows it", time.Since(began).Round(time.Millisecond))

	// Every query parses and names only series that were scraped (the
	// labels a query groups or matches by, rabbitmq_cluster, are none).
	scraped := prom.names()
	named := regexp.MustCompile(`\b(?:transferconsumer|go_sql|rabbitmq)_[a-z_]+\b`)
	grouping := regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	for _, p := range board.panels {
		for _, expr := range p.exprs {
			if _, err := prom.query(substitute(expr, values)); err != nil {
				t.Errorf("panel %q: %s: %v", p.title, expr, err)
			}
			for _, name := range named.FindAllString(grouping.ReplaceAllString(expr, ""), -1) {
				if !scraped[name] {
					t.Errorf("panel %q reads %s, which neither the service nor the plugin exports", p.title, name)
				}
			}
		}
	}
	for name, selector := range board.variables {
		got, err := prom.query(substitute(selector, values))
		if err != nil || len(got) == 0 {
			t.Errorf("variable %s: %s finds nothing (%v)", name, selector, err)
		}
	}

	// Each of the broker's alarms, for the cluster serving the vhost.
	alarms := slices.IndexFunc(board.panels, func(p boardPanel) bool { return p.title == "Broker alarms" })
	if alarms < 0 {
		t.Fatal("the dashboard has no panel \"Broker alarms\"")
	}
	for _, expr := range board.panels[alarms].exprs {
		if got, err := prom.query(substitute(expr, values)); err != nil || len(got) != 1 || got[0].Metric["rabbitmq_cluster"] == "" {
			t.Errorf("panel \"Broker alarms\": %s: %v (%v), want the cluster's alarm, on or off", expr, got, err)
		}
	}

	// What the load did, in the words the panels show it.
	wantLabel(t, prom, substitute(board.expr(t, "Blocked queues"), values), "reason", "statement-timeout")
	wantLabel(t, prom, substitute(board.expr(t, "Dead letters by class"), values), "class", "poison")
	var rules struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name, Health, LastError string
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := prom.get("/api/v1/rules", &rules); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range rules.Data.Groups {
		for _, r := range g.Rules {
			n++
			if r.Health == "err" {
				t.Errorf("alert rule %s: %s", r.Name, r.LastError)
			}
		}
	}
	if n == 0 {
		t.Error("Prometheus loaded no alert rule")
	}
}

// wantLabel fails unless expr finds a series whose label is value.
func wantLabel(t *testing.T, prom *promServer, expr, label, value string) {
	t.Helper()
	got, err := prom.query(expr)
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	if !slices.ContainsFunc(got, func(s sample) bool { return s.Metric[label] == value }) {
		t.Errorf("%s: no series with %s=%q in %v", expr, label, value, got)
	}
}

// boardPanel is a panel of the dashboard: its title and its queries.
type boardPanel struct {
	title string
	exprs []string
}

// board is what the test reads of prometheus/dashboard.json.
type board struct {
	panels    []boardPanel
	variables map[string]string // name → the selector of its label_values
}

func readDashboard(t *testing.T) board {
	t.Helper()
	raw, err := os.ReadFile("../prometheus/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Type, Title string
			Targets     []struct{ Expr string }
		}
		Templating struct {
			List []struct{ Type, Name, Definition string }
		}
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	b := board{variables: map[string]string{}}
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		bp := boardPanel{title: p.Title}
		for _, q := range p.Targets {
			bp.exprs = append(bp.exprs, q.Expr)
		}
		b.panels = append(b.panels, bp)
	}
	labelValues := regexp.MustCompile(`^label_values\((.+), [a-z_]+\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Fatalf("variable %s: %q is not label_values(selector, label)", v.Name, v.Definition)
		}
		b.variables[v.Name] = m[1]
	}
	if len(b.panels) < 8 || len(b.variables) < 3 {
		t.Fatalf("the dashboard has %d panels and %d query variables, want at least 8 and 3", len(b.panels), len(b.variables))
	}
	return b
}

// expr returns the first query of the panel titled title.
func (b board) expr(t *testing.T, title string) string {
	t.Helper()
	for _, p := range b.panels {
		if p.title == title && len(p.exprs) > 0 {
			return p.exprs[0]
		}
	}
	t.Fatalf("the dashboard has no panel %q", title)
	return ""
}
