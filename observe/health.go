// Package observe is what the service shows of itself: /healthz and
// /readyz (Health), the Prometheus series (Metrics), the log lines
// (NewLogger) and the traces (NewTracer), and the HTTP server that serves
// the probes, the metrics and, when asked, Go's profiles (Serve).
package observe

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"transferconsumer/config"
	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/topology"
)

// Health is what /readyz and the scrape-time gauges read. The HTTP server
// starts before the database is open and before the consumer exists, so
// that a probe is answered from the first instant; each part is filled in
// as start-up gets to it.
type Health struct {
	svc      atomic.Pointer[consumer.Service]
	database atomic.Pointer[sqlx.DB]
	starting atomic.Pointer[string]      // why the database is not ready yet, during start-up
	schema   atomic.Pointer[schemaState] // nil until the schema was first checked
	// replication says whether a failover may lose acked events
	replication atomic.Pointer[db.ReplicationWatch]
	// daysAhead, when set, answers for the database's inbox_days_ahead
	// (tests).
	daysAhead func() (int, bool)
}

// Database records the database, once it is open.
func (h *Health) Database(database *sqlx.DB) { h.database.Store(database) }

// Service records the consumer, once it exists.
func (h *Health) Service(svc *consumer.Service) { h.svc.Store(svc) }

// Replication has /readyz say whether a failover may lose acked events.
func (h *Health) Replication(w *db.ReplicationWatch) { h.replication.Store(w) }

// schemaState is what start-up last found of the schema.
type schemaState struct {
	current bool
	reason  string   // why the service waits, when it is not current
	missing []string // the migrations missing, when that is why
}

// SchemaWaiting records why start-up waits for the schema.
func (h *Health) SchemaWaiting(err error) {
	st := &schemaState{reason: err.Error()}
	if behind, ok := errors.AsType[*db.Behind](err); ok {
		st.missing = behind.Missing
	}
	h.schema.Store(st)
}

// SchemaCurrent records that the schema has every migration.
func (h *Health) SchemaCurrent() { h.schema.Store(&schemaState{current: true}) }

// Starting records why start-up waits for the database.
func (h *Health) Starting(format string, a ...any) {
	s := fmt.Sprintf(format, a...)
	h.starting.Store(&s)
}

// state returns the consumer's state; before it exists, nothing connected.
func (h *Health) state() consumer.State {
	if svc := h.svc.Load(); svc != nil {
		return svc.State()
	}
	return consumer.State{DLQDepth: -1}
}

// pingDB pings the database; before it is open, it returns why not.
func (h *Health) pingDB() error {
	database := h.database.Load()
	if database == nil {
		if s := h.starting.Load(); s != nil {
			return errors.New(*s)
		}
		return errors.New("not open yet")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return database.PingContext(ctx)
}

// readiness returns /readyz's status and body: ready when the database
// answers, the broker is connected, every queue has its consumer, none is
// blocked and none beyond QUEUE_COUNT is left unconsumed; otherwise each
// part that is not says why in words ("database", "broker"), beside the
// figures.
func (h *Health) readiness() (int, map[string]any) {
	st := h.state()
	dbErr := h.pingDB()
	body := map[string]any{
		"broker_connected": st.Connected,
		"queues_consumed":  st.Consuming,
		"queues":           st.Queues,
		"database_up":      dbErr == nil,
		"database":         "ok",
		"schema":           "ok",
		"broker":           "ok",
	}
	ready := dbErr == nil
	if dbErr != nil {
		body["database"] = config.RedactErr(dbErr)
		body["database_error"] = body["database"]
	}
	schema := h.schema.Load()
	switch {
	case schema == nil:
		body["schema"] = "not checked yet: waiting for the database"
	case !schema.current:
		body["schema"] = config.RedactText(schema.reason)
		if len(schema.missing) > 0 {
			body["missing_migrations"] = schema.missing
		}
	}
	ready = ready && body["schema"] == "ok"
	switch {
	case h.svc.Load() == nil && schema != nil && !schema.current:
		body["broker"] = "not started: waiting for the schema"
	case h.svc.Load() == nil:
		body["broker"] = "not started: waiting for the database"
	case !st.Connected && st.BrokerErr != "":
		body["broker"] = config.RedactText(st.BrokerErr)
	case !st.Connected:
		body["broker"] = "connecting"
	case st.Consuming < st.Queues:
		body["broker"] = fmt.Sprintf("consuming %d of %d queues", st.Consuming, st.Queues)
	}
	ready = ready && body["broker"] == "ok"
	if len(st.Blocked) > 0 {
		ready = false
		blocked := make([]map[string]any, 0, len(st.Blocked))
		for _, b := range st.Blocked {
			blocked = append(blocked, map[string]any{
				"queue": b.Queue, "event_id": b.EventID, "since": b.Since.UTC().Format(time.RFC3339Nano),
				"class": string(b.Class), "attempts": b.Attempts, "reason": config.RedactText(b.Reason),
			})
		}
		body["blocked_queues"] = blocked
	}
	if len(st.Unconsumed) > 0 {
		ready = false
		body["unconsumed_queues"] = st.Unconsumed
	}
	if st.PublishBlocked != "" {
		body["broker_alarm"] = st.PublishBlocked
	}
	if !topologyReadiness(st.Topology, body) {
		ready = false
	}
	if n, ok := h.inboxDaysAhead(); ok && n < InboxDaysWarning {
		body["inbox"] = fmt.Sprintf("%d day(s) of inbox partitions made ahead: the schema's owner must run `transferconsumer migrate` (daily), or claims of later days go where retention deletes them row by row (adr/0011)", n)
	}
	if w := h.replication.Load(); w != nil {
		detail, ok := w.Status()
		body["replication"] = detail
		ready = ready && ok
	}
	body["ready"] = ready
	if !ready {
		return http.StatusServiceUnavailable, body
	}
	return http.StatusOK, body
}

// InboxDaysWarning is the number of inbox partitions made ahead below
// which /readyz warns (without turning unready) and the
// TransferConsumerInboxDaysRunningOut alert fires: a week to run the
// owner's `migrate`, out of the 31 days it makes.
const InboxDaysWarning = 7

// inboxDaysAhead asks the database how many days ahead have their inbox
// partition (db.DaysAhead), within a second; false when it cannot tell or
// the inbox is not partitioned.
func (h *Health) inboxDaysAhead() (int, bool) {
	if h.daysAhead != nil {
		return h.daysAhead()
	}
	database := h.database.Load()
	if database == nil {
		return 0, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	n, ok, err := db.DaysAhead(ctx, database)
	return n, ok && err == nil
}

// topologyReadiness says in body what the check of a topology made by
// others found (DECLARE_TOPOLOGY=false): "topology" is "ok", why it was not
// checked, or that it differs, with each finding in "topology_findings". It
// returns false when a finding keeps queues from being consumed; one that
// only warns, or a check that could not be made, leaves readiness alone.
func topologyReadiness(check *topology.Check, body map[string]any) bool {
	if check == nil {
		return true // the service declares its own
	}
	body["topology"] = config.RedactText(check.Status)
	if len(check.Findings) == 0 {
		return true
	}
	findings := make([]map[string]any, 0, len(check.Findings))
	for _, f := range check.Findings {
		findings = append(findings, map[string]any{
			"severity": string(f.Severity), "object": f.Object, "argument": f.Argument,
			"found": f.Found, "wanted": f.Wanted, "why": f.Why, "fix": f.Fix,
		})
	}
	body["topology_findings"] = findings
	if len(check.NotConsumed) == 0 {
		return true
	}
	body["not_consumed_queues"] = check.NotConsumed
	return false
}
