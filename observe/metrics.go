package observe

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"transferconsumer/config"
	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/event"
)

// Metrics are the service's Prometheus series. Each is fed from one place:
// the consumer's decision and retry hooks, the journal's reports, the
// prune and reconcile jobs, or a scrape-time read of the service's state
// (scrape.go).
type Metrics struct {
	registry   *prometheus.Registry
	collectors []prometheus.Collector // what registry holds
	events     *prometheus.CounterVec
	latency    *prometheus.HistogramVec
	retries    *prometheus.CounterVec
	batches    prometheus.Histogram
	conflicts  prometheus.Counter
	pruned     prometheus.Counter
	restored   prometheus.Counter
	// The journal's entries kept in the database while the stream does
	// not take them: now, by queue, and all that ever were.
	unprotected *prometheus.GaugeVec
	kept        prometheus.Counter
	// Those a loss of their commits took before the stream took them.
	lost        *prometheus.CounterVec
	journalRead prometheus.Counter
	held        *prometheus.HistogramVec
	stalls      *prometheus.CounterVec
	reconcile   reconcileGauges // reconcile.go

	// Each partition queue's series of the common outcomes, resolved once
	// rather than looked up by label for every event; read only after
	// NewMetrics.
	queues map[string]*queueSeries
}

// queueSeries are one queue's series that every event or transaction
// touches.
type queueSeries struct {
	applied, duplicate               prometheus.Counter
	appliedLatency, duplicateLatency prometheus.Observer
	held                             prometheus.Observer // with the journal
}

// NewMetrics returns the series, registered: those fed by the hooks below,
// and those read at scrape time from h and from cfg's settings.
func NewMetrics(h *Health, cfg config.Config) *Metrics {
	const ns = "transferconsumer"
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "events_total",
			Help: "Deliveries by queue, outcome (applied, duplicate, dead_lettered, requeued) and failure class.",
		}, []string{"queue", "outcome", "class"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "event_processing_seconds",
			Help:    "Time from receiving a delivery to acking, dead-lettering or requeueing it, by queue and outcome.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"queue", "outcome"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "db_retries_total",
			Help: "In-place retries of transient failures, by queue and reason (statement-timeout, unavailable, read-only, …).",
		}, []string{"queue", "reason"}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "producer_conflicts_total",
			Help: "Deliveries whose eventId was applied before with other content; alert on any increase.",
		}),
		batches: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Name: "batch_size",
			Help:    "Deliveries taken in one batch (BATCH_MAX above 1): how full the batches are.",
			Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 200, 500},
		}),
		pruned: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "inbox_pruned_rows_total",
			Help: "Inbox rows removed by retention.",
		}),
		restored: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "journal_restored_total",
			Help: "Journal entries applied again because the database had lost them (JOURNAL_STREAM, adr/0014).",
		}),
		unprotected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "journal_unprotected_events",
			Help: "Acked events whose journal entries are kept in the database because the stream did not take them (an alarm, a stream unavailable): a failover or restore that loses their commits loses them (adr/0014).",
		}, []string{"queue"}),
		journalRead: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "journal_read_bytes_total",
			Help: "Bytes of journal messages the service's reads of the stream passed over (at start, after a loss, at a replica's check): what a handover or a restore costs the broker (JOURNAL_CLOCK_SKEW, adr/0014).",
		}),
		kept: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "journal_kept_total",
			Help: "Journal entries kept in the database because the stream did not take them in time (JOURNAL_KEEP_AFTER, adr/0014).",
		}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "journal_lost_events_total",
			Help: "Acked events lost, by queue: their journal entries were kept in the database, and a failover or restore took their commits back before the stream took them; they are in neither (the log names their sequences, adr/0014). Alert on any increase.",
		}, []string{"queue"}),
		held: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "journal_hold_seconds",
			Help:    "Time from a transaction's commit until the journal's stream confirmed its entries, or the database kept them: how long its acks waited for the journal (adr/0014).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"queue"}),
		stalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "journal_stalls_total",
			Help: "Times a queue's acks began to wait because neither the journal's stream nor the database took its entries (adr/0014).",
		}, []string{"queue"}),
		queues: map[string]*queueSeries{},
	}
	// Series an alert or a panel watches exist from the start, at zero.
	for i := 0; i < cfg.QueueCount; i++ {
		q := cfg.Topology().Queue(i)
		for _, oc := range [][2]string{{"applied", ""}, {"duplicate", ""}, {"requeued", "unknown"},
			{"dead_lettered", "poison"}, {"dead_lettered", "producer-conflict"}, {"dead_lettered", "invalid-transition"}, {"dead_lettered", "unauthorized"}} {
			m.events.WithLabelValues(q, oc[0], oc[1])
		}
		m.queues[q] = m.resolve(q)
		if cfg.JournalStream != "" {
			m.queues[q].held = m.held.WithLabelValues(q)
			m.unprotected.WithLabelValues(q)
			m.lost.WithLabelValues(q)
			m.stalls.WithLabelValues(q)
		}
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: name, Help: help}, f)
	}
	boolean := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	m.collectors = []prometheus.Collector{
		m.events, m.latency, m.retries, m.conflicts, m.pruned, m.restored, m.unprotected, m.kept, m.lost, m.journalRead, m.batches,
		m.held, m.stalls,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		// Two settings, so that alert rules compare against the values
		// the service runs with (prometheus/alerts.yml).
		gauge("queue_count", "QUEUE_COUNT: the partition queues this instance consumes when all is well.",
			func() float64 { return float64(cfg.QueueCount) }),
		gauge("inbox_ttl_seconds", "INBOX_TTL: how long an applied eventId is remembered.",
			func() float64 { return cfg.InboxTTL.Seconds() }),
		gauge("broker_connected", "1 while a broker connection is up.",
			func() float64 { return boolean(h.state().Connected) }),
		gauge("queues_consumed", "Partition queues with a running consumer.",
			func() float64 { return float64(h.state().Consuming) }),
		gauge("queues_blocked", "Partition queues retrying their message in hand because the environment failed (adr/0002).",
			func() float64 { return float64(len(h.state().Blocked)) }),
		gauge("unconsumed_queues", "Partition queues beyond QUEUE_COUNT that exist: their messages wait for an instance with a larger QUEUE_COUNT.",
			func() float64 { return float64(len(h.state().Unconsumed)) }),
		gauge("dlq_messages", "Dead letters waiting in the dead-letter queue, as last read (every 10 s); -1 before the first read.",
			func() float64 { return float64(h.state().DLQDepth) }),
		newQueueState(h, ns, cfg.JournalStream != ""),
		gauge("database_up", "1 when the database answered a ping at scrape time.",
			func() float64 { return boolean(h.pingDB() == nil) }),
		gauge("database_synchronous_standby", "1 when the database names a synchronous standby (a failover to it keeps every acked event), 0 when it names none, -1 before it was read.",
			h.synchronousStandby),
		newPoolStats(h, ns),
		gauge("inbox_oldest_row_age_seconds", "Age of the oldest inbox row; retention keeps it near INBOX_TTL.",
			func() float64 {
				database := h.database.Load()
				if database == nil {
					return -1
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				age, err := db.OldestInboxAge(ctx, database)
				if err != nil {
					return -1
				}
				return age.Seconds()
			}),
		gauge("inbox_days_ahead", "Days from tomorrow on with their own inbox partition (adr/0011): claims of later days go to a partition retention drops only a year on; -1 when not known.",
			func() float64 {
				n, ok := h.inboxDaysAhead()
				if !ok {
					return -1
				}
				return float64(n)
			}),
	}
	var reconciled []prometheus.Collector
	m.reconcile, reconciled = newReconcileGauges(ns)
	m.collectors = append(m.collectors, reconciled...)
	m.registry.MustRegister(m.collectors...)
	return m
}

// resolve returns queue's series.
func (m *Metrics) resolve(queue string) *queueSeries {
	return &queueSeries{
		applied: m.events.WithLabelValues(queue, "applied", ""), duplicate: m.events.WithLabelValues(queue, "duplicate", ""),
		appliedLatency: m.latency.WithLabelValues(queue, "applied"), duplicateLatency: m.latency.WithLabelValues(queue, "duplicate"),
	}
}

// series returns queue's series: resolved at start for the partition
// queues, looked up by label for any other.
func (m *Metrics) series(queue string) *queueSeries {
	if s, ok := m.queues[queue]; ok {
		return s
	}
	return m.resolve(queue)
}

// Decided is the consumer's Observe hook.
func (m *Metrics) Decided(d consumer.Decision) {
	switch {
	case d.Action == consumer.ActionAck && d.Class == "" && !d.Duplicate:
		s := m.series(d.Queue)
		s.applied.Inc()
		s.appliedLatency.Observe(d.Duration.Seconds())
		return
	case d.Action == consumer.ActionAck && d.Class == "":
		s := m.series(d.Queue)
		s.duplicate.Inc()
		s.duplicateLatency.Observe(d.Duration.Seconds())
		return
	}
	outcome := d.Outcome()
	m.events.WithLabelValues(d.Queue, outcome, string(d.Class)).Inc()
	m.latency.WithLabelValues(d.Queue, outcome).Observe(d.Duration.Seconds())
	if d.Class == event.ClassConflict {
		m.conflicts.Inc()
	}
}

// Retried is the consumer's ObserveRetry hook.
func (m *Metrics) Retried(r consumer.Retry) {
	m.retries.WithLabelValues(r.Queue, reason(event.ClassOf(context.Background(), r.Err), r.Err)).Inc()
}

// Batch is the consumer's ObserveBatch hook.
func (m *Metrics) Batch(n int) { m.batches.Observe(float64(n)) }

// Restored counts journal entries applied again.
func (m *Metrics) Restored(_ string, n int) { m.restored.Add(float64(n)) }

// JournalRead counts the bytes a read of the journal passed over.
func (m *Metrics) JournalRead(bytes int) { m.journalRead.Add(float64(bytes)) }

// JournalHeld records how long a transaction's acks waited for the
// journal.
func (m *Metrics) JournalHeld(queue string, wait time.Duration) {
	if s := m.series(queue); s.held != nil {
		s.held.Observe(wait.Seconds())
		return
	}
	m.held.WithLabelValues(queue).Observe(wait.Seconds())
}

// JournalStalled counts a stall of queue's journal at its first attempt:
// the journal's Stalled report comes again at each attempt after.
func (m *Metrics) JournalStalled(queue string, attempts int) {
	if attempts == 1 {
		m.stalls.WithLabelValues(queue).Inc()
	}
}

// Unprotected counts a queue's journal entries kept in the database (n >
// 0), and those the stream then took from there (n < 0).
func (m *Metrics) Unprotected(queue string, n int) {
	m.unprotected.WithLabelValues(queue).Add(float64(n))
	if n > 0 {
		m.kept.Add(float64(n))
	}
}

// JournalLost counts a queue's acked events whose journal entries went
// with their commits while kept in the database (the journal has taken
// them off Unprotected already).
func (m *Metrics) JournalLost(queue string, n int) { m.lost.WithLabelValues(queue).Add(float64(n)) }

// Pruned counts inbox rows removed by retention.
func (m *Metrics) Pruned(rows int64) { m.pruned.Add(float64(rows)) }
