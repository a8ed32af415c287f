package observe

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/event"
	"transferconsumer/journal"
)

// The series read from the service's state at scrape time, beside the
// gauges of metrics.go.

// Reasons a queue is blocked, or a retry happened, besides the database's
// own (db.Cause): the journal's, one for each cause the service knows
// (adr/0014), so that no queue it holds for one says "other".
const (
	reasonJournalStalled      = "journal-stalled"      // the journal's stream and the database both refuse its entries
	reasonJournalUnrestorable = "journal-unrestorable" // entries in neither the database nor the journal (recover --accept-loss)
	reasonJournalUnread       = "journal-unread"       // the queue must read the journal first, and the read cannot begin
	reasonJournalUnvouched    = "journal-unvouched"    // that, and the database cannot vouch for the queue's mark
	reasonJournalRestore      = "journal-restore"      // a restore from the journal began and did not end
	reasonPanic               = "panic"
	reasonUnknown             = "unknown" // an unclassified error the database's causes do not name either
)

// reason names why a queue is blocked or was retried, in a closed
// vocabulary (a label): the words of the error are in /readyz and the log.
// The journal's causes come first: a read of the stream that cannot begin
// may fail on the network, which the database's causes would name as the
// database's. A restore's error takes the database's cause when the
// database named one (it failed the restore), and is a restore's
// otherwise: a read cut short, a deadline of the restore's own.
func reason(class event.Class, err error) string {
	var short *journal.ShortError
	switch {
	case errors.Is(err, consumer.ErrJournalStalled):
		return reasonJournalStalled
	case errors.As(err, &short):
		return reasonJournalUnrestorable
	case errors.Is(err, journal.ErrUnvouched):
		return reasonJournalUnvouched
	case errors.Is(err, event.ErrJournalUnread):
		return reasonJournalUnread
	case class == event.ClassPanic:
		return reasonPanic
	}
	c := db.Cause(err)
	switch {
	case errors.Is(err, journal.ErrRestore) && (c == db.CauseOther || c == db.CauseTimeout):
		return reasonJournalRestore
	case (c == db.CauseOther || c == "") && class == event.ClassUnknown:
		return reasonUnknown
	case c == "":
		return db.CauseOther
	}
	return c
}

// queueState reports each partition queue's state: since when it has been
// blocked (0 when it is not), why, for a blocked one, and with the journal
// how many of its events the journal cannot restore.
type queueState struct {
	h                           *Health
	journal                     bool
	since, reason, unrestorable *prometheus.Desc
}

func newQueueState(h *Health, ns string, journal bool) queueState {
	return queueState{h: h, journal: journal,
		since: prometheus.NewDesc(ns+"_queue_blocked_since_seconds",
			"Unix time since which the queue has retried its message in hand because the environment failed; 0 when it is not blocked.",
			[]string{"queue"}, nil),
		reason: prometheus.NewDesc(ns+"_queue_blocked_reason",
			"1 for each blocked queue, with why in reason (statement-timeout, unavailable, read-only, no-sync-standby, journal-stalled, journal-unrestorable, journal-unread, journal-unvouched, journal-restore, panic, unknown, …) and its failure class; /readyz has the words.",
			[]string{"queue", "reason", "class"}, nil),
		unrestorable: prometheus.NewDesc(ns+"_journal_unrestorable_events",
			"Events at most, acked once, that are in neither the database nor the journal: the queue waits until recover --accept-loss (JOURNAL_STREAM, adr/0014).",
			[]string{"queue"}, nil),
	}
}

func (s queueState) Describe(ch chan<- *prometheus.Desc) {
	ch <- s.since
	ch <- s.reason
	ch <- s.unrestorable
}

func (s queueState) Collect(ch chan<- prometheus.Metric) {
	svc := s.h.svc.Load()
	if svc == nil {
		return
	}
	st := svc.State()
	blocked := map[string]consumer.Blocked{}
	for _, b := range st.Blocked {
		blocked[b.Queue] = b
	}
	for i := 0; i < st.Queues; i++ {
		q := svc.Queue(i)
		b, ok := blocked[q]
		since, missing := 0.0, 0.0
		if ok {
			since = float64(b.Since.UnixMilli()) / 1000
			ch <- prometheus.MustNewConstMetric(s.reason, prometheus.GaugeValue, 1, q, reason(b.Class, b.Err), string(b.Class))
			var short *journal.ShortError
			if errors.As(b.Err, &short) {
				missing = float64(short.Missing())
			}
		}
		ch <- prometheus.MustNewConstMetric(s.since, prometheus.GaugeValue, since, q)
		if s.journal {
			ch <- prometheus.MustNewConstMetric(s.unrestorable, prometheus.GaugeValue, missing, q)
		}
	}
}

// poolStats reports the database pool's statistics (Go's go_sql_*
// series, db_name "transferconsumer") once the database is open.
type poolStats struct {
	h    *Health
	name string
	none prometheus.Collector // describes the series before the database is open
}

func newPoolStats(h *Health, name string) poolStats {
	return poolStats{h: h, name: name, none: collectors.NewDBStatsCollector(nil, name)}
}

func (p poolStats) Describe(ch chan<- *prometheus.Desc) { p.none.Describe(ch) }

func (p poolStats) Collect(ch chan<- prometheus.Metric) {
	if database := p.h.database.Load(); database != nil {
		collectors.NewDBStatsCollector(database.DB, p.name).Collect(ch)
	}
}

// synchronousStandby is 1 when the database names a synchronous standby,
// 0 when it names none, -1 before it was read.
func (h *Health) synchronousStandby() float64 {
	r, ok := h.replication.Load().Current()
	switch {
	case !ok:
		return -1
	case r.Synchronous():
		return 1
	}
	return 0
}
