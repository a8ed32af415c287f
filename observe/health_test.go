package observe

import (
	"errors"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"transferconsumer/db"
	"transferconsumer/topology"
)

// While the schema lacks migrations, /readyz says so in words, lists them,
// and says the consumer waits for the schema, not for the database.
func TestReadinessSaysTheSchemaIsBehind(t *testing.T) {
	h := &Health{}
	h.Starting("connect to database: dial tcp: connection refused")
	code, body := h.readiness()
	if code != http.StatusServiceUnavailable || body["schema"] != "not checked yet: waiting for the database" ||
		body["broker"] != "not started: waiting for the database" {
		t.Errorf("before the database: %d %v", code, body)
	}

	behind := &db.Behind{Missing: []string{"0009_producer_conflict_once.sql"}, Role: "svc",
		Refused: errors.New("pq: permission denied for schema public (42501)")}
	h.SchemaWaiting(behind)
	code, body = h.readiness()
	if code != http.StatusServiceUnavailable || body["ready"] != false {
		t.Errorf("behind: %d, ready %v", code, body["ready"])
	}
	if body["schema"] != behind.Error() || !reflect.DeepEqual(body["missing_migrations"], behind.Missing) {
		t.Errorf("behind: schema %q, missing %v", body["schema"], body["missing_migrations"])
	}
	if body["broker"] != "not started: waiting for the schema" {
		t.Errorf("behind: broker %q", body["broker"])
	}

	h.SchemaWaiting(errors.New("migrate: pq: cannot execute CREATE TABLE in a read-only transaction (25006)"))
	if _, body = h.readiness(); body["missing_migrations"] != nil || body["schema"] == "ok" {
		t.Errorf("another failure: %v", body)
	}
	h.SchemaCurrent()
	if _, body = h.readiness(); body["schema"] != "ok" || body["missing_migrations"] != nil {
		t.Errorf("current: %v", body)
	}
}

// A finding that keeps a queue from being consumed makes the service not
// ready and is said in words; one that only warns is said and leaves it
// ready; without a check (the service declares its own) nothing is said.
func TestReadinessSaysWhatTheTopologyCheckFound(t *testing.T) {
	refuse := topology.Finding{Severity: topology.Refuse, Object: "queue transfers.1", Queue: "transfers.1",
		Argument: "x-single-active-consumer", Found: "none", Wanted: "true", Why: "order", Fix: "redeclare"}
	warn := topology.Finding{Severity: topology.Warn, Object: "queue transfers.0", Argument: "x-delivery-limit",
		Found: "5", Wanted: "10", Why: "limit", Fix: "set DELIVERY_LIMIT=5"}
	tests := []struct {
		name  string
		check *topology.Check
		ready bool
		keys  []string
	}{
		{"declared by the service", nil, true, nil},
		{"not checked", &topology.Check{Status: "not checked: set MANAGEMENT_URL"}, true, []string{"topology"}},
		{"a warning", &topology.Check{Status: "differs", Findings: []topology.Finding{warn}}, true,
			[]string{"topology", "topology_findings"}},
		{"a queue not consumed", &topology.Check{Status: "differs", Findings: []topology.Finding{refuse, warn},
			NotConsumed: []string{"transfers.1"}}, false, []string{"topology", "topology_findings", "not_consumed_queues"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := map[string]any{}
			if got := topologyReadiness(tt.check, body); got != tt.ready {
				t.Errorf("ready = %v, want %v", got, tt.ready)
			}
			if len(body) != len(tt.keys) {
				t.Errorf("body %v, want the keys %v", body, tt.keys)
			}
			for _, k := range tt.keys {
				if _, ok := body[k]; !ok {
					t.Errorf("body %v lacks %s", body, k)
				}
			}
		})
	}
}

// Fewer than InboxDaysWarning days of inbox partitions made ahead: /readyz
// says so, and what to run, without changing readiness; enough days, or
// no answer (an inbox not partitioned), and it says nothing.
func TestReadinessWarnsOfTheInboxDaysRunningOut(t *testing.T) {
	for _, tt := range []struct {
		days  int
		known bool
		warn  bool
	}{{InboxDaysWarning - 1, true, true}, {0, true, true}, {InboxDaysWarning, true, false}, {31, true, false}, {0, false, false}} {
		h := &Health{daysAhead: func() (int, bool) { return tt.days, tt.known }}
		h.SchemaCurrent()
		quiet := &Health{daysAhead: func() (int, bool) { return 31, true }}
		quiet.SchemaCurrent()
		code, body := h.readiness()
		wantCode, want := quiet.readiness()
		msg, said := body["inbox"].(string)
		switch {
		case said != tt.warn:
			t.Errorf("%d days (known %v): inbox %q, want a warning: %v", tt.days, tt.known, msg, tt.warn)
		case tt.warn && (!strings.Contains(msg, "transferconsumer migrate") || !strings.HasPrefix(msg, strconv.Itoa(tt.days)+" day(s)")):
			t.Errorf("%d days: inbox %q, want the count and what to run", tt.days, msg)
		}
		if code != wantCode || body["ready"] != want["ready"] {
			t.Errorf("%d days: readiness %d %v, want it unchanged (%d %v)", tt.days, code, body["ready"], wantCode, want["ready"])
		}
	}
}
