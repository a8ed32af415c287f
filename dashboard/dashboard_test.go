package dashboard

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The committed JSON is what the code makes: a panel changed in Go and
// not generated, or the JSON edited by hand, fails here.
func TestTheCommittedDashboardIsGenerated(t *testing.T) {
	want, err := JSON()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join("..", File))
	if err != nil {
		t.Fatalf("%v: run go generate ./dashboard", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is not what the dashboard package makes: run go generate ./dashboard and commit it", File)
	}
}

// jsonPanel is what the tests read of a panel.
type jsonPanel struct {
	ID          int    `json:"id"`
	Type        string `json:"type"`
	Title       string `json:"title"`
	Description string `json:"description"`
	Targets     []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
}

// Every group the operator asked for has its row and panels, each panel a
// description and queries, and the service's series are read through the
// instance variable.
func TestTheDashboardCoversEachGroup(t *testing.T) {
	raw, err := JSON()
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID       string      `json:"uid"`
		Panels    []jsonPanel `json:"panels"`
		Templates struct {
			List []struct {
				Name string `json:"name"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	var vars []string
	for _, v := range d.Templates.List {
		vars = append(vars, v.Name)
	}
	for _, want := range []string{"datasource", "instance", "queue", "vhost"} {
		if !slices.Contains(vars, want) {
			t.Errorf("no %s variable; the variables are %v", want, vars)
		}
	}
	rows := map[string]int{}
	var row string
	panels := 0
	ids, titles := map[int]bool{}, map[string]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			row = p.Title
			rows[row] = 0
			continue
		}
		panels++
		rows[row]++
		if titles[p.Title] {
			t.Errorf("two panels titled %q", p.Title)
		}
		titles[p.Title] = true
		if p.Description == "" || len(p.Targets) == 0 {
			t.Errorf("panel %q has no description or no query", p.Title)
		}
		for _, q := range p.Targets {
			service := strings.Contains(q.Expr, "transferconsumer_") || strings.Contains(q.Expr, "go_sql_")
			if service && !strings.Contains(q.Expr, `instance=~"$instance"`) {
				t.Errorf("panel %q query %s reads the service without the instance variable: %s", p.Title, q.RefID, q.Expr)
			}
			if strings.Contains(q.Expr, "rabbitmq_") && !strings.Contains(q.Expr, `vhost=~"$vhost"`) {
				t.Errorf("panel %q query %s reads RabbitMQ without the vhost variable: %s", p.Title, q.RefID, q.Expr)
			}
		}
	}
	if panels < 8 {
		t.Errorf("%d panels, want at least 8", panels)
	}
	for _, want := range []string{"Events", "Blocked queues and retries", "Dead letters", "Producers", "Reconciliation",
		"Journal (JOURNAL_STREAM)", "Database", "Consumers", "RabbitMQ (rabbitmq_prometheus)"} {
		if rows[want] == 0 {
			t.Errorf("no panel in the row %q; rows: %v", want, rows)
		}
	}
	if d.UID != UID {
		t.Errorf("uid %q, want %q", d.UID, UID)
	}
}
