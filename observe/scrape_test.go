package observe

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/lib/pq"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"transferconsumer/config"
	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/event"
	"transferconsumer/journal"
)

// A blocked queue's reason, and a retry's, is a word of a closed
// vocabulary, named from the error as the worker and the journal wrap it.
func TestReasonNamesWhyAQueueWaits(t *testing.T) {
	timeout := event.Transient(fmt.Errorf("apply: %w", &pq.Error{Code: "57014", Message: "canceling statement due to statement timeout"}))
	tests := []struct {
		name  string
		class event.Class
		err   error
		want  string
	}{
		{"APPLY_TIMEOUT", event.ClassTransient, timeout, db.CauseStatementTimeout},
		{"no synchronous standby", event.ClassTransient, event.Transient(db.ErrNoSyncStandby), db.CauseNoSyncStandby},
		{"the journal's stream and the database refuse", event.ClassTransient,
			fmt.Errorf("%w: %w", consumer.ErrJournalStalled, errors.New("blocked")), reasonJournalStalled},
		{"the journal cannot restore", event.ClassUnknown,
			fmt.Errorf("restore: %w", &journal.ShortError{Queue: "transfers.0", Mark: 3, First: 9}), reasonJournalUnrestorable},
		// A queue held by the journal, its errors wrapped as the journal's
		// lane wraps them (journal.ErrRestore) and the worker after it.
		{"the journal cannot be read", event.ClassTransient, held(fmt.Errorf("fence: %w", event.ErrJournalUnread)), reasonJournalUnread},
		{"the journal cannot be read, the network says why", event.ClassTransient,
			held(fmt.Errorf("%w: %w", event.ErrJournalUnread, &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED})), reasonJournalUnread},
		{"the journal cannot be read, and the database cannot vouch", event.ClassTransient,
			held(fmt.Errorf("%w: %w", event.ErrJournalUnread, journal.ErrUnvouched)), reasonJournalUnvouched},
		{"the probe of the journal after the session ended", event.ClassTransient,
			fmt.Errorf("the journal: %w", event.ErrJournalUnread), reasonJournalUnread},
		{"a restore's read cut short", event.ClassTransient, held(errors.New("the read ended before its fence")), reasonJournalRestore},
		{"a restore's own deadline", event.ClassTransient, held(fmt.Errorf("not confirmed: %w", context.DeadlineExceeded)), reasonJournalRestore},
		{"a restore the database failed", event.ClassTransient,
			held(&pq.Error{Code: "57014", Message: "canceling statement due to statement timeout"}), db.CauseStatementTimeout},
		{"a restore another reader keeps overtaking", event.ClassTransient, held(fmt.Errorf("%w: holds 9", event.ErrJournalGap)), db.CauseJournalGap},
		{"a restore that waits for recover --accept-loss", event.ClassTransient,
			held(&journal.ShortError{Queue: "transfers.0", Mark: 3, First: 9}), reasonJournalUnrestorable},
		{"a panic", event.ClassPanic, event.Panicked(errors.New("boom")), reasonPanic},
		{"unclassified", event.ClassUnknown, errors.New("new"), reasonUnknown},
		{"unclassified, named by the database", event.ClassUnknown, &pq.Error{Code: "25006"}, db.CauseReadOnly},
		{"transient, unnamed", event.ClassTransient, event.Transient(errors.New("new")), db.CauseOther},
		{"no error", event.ClassTransient, nil, db.CauseOther},
	}
	for _, tt := range tests {
		if got := reason(tt.class, tt.err); got != tt.want {
			t.Errorf("%s: reason %q, want %q", tt.name, got, tt.want)
		}
	}
}

// held is err as a journal's lane returns it when its restore did not
// end: a journal.ErrRestore, and transient.
func held(err error) error { return event.Transient(fmt.Errorf("%w: %w", journal.ErrRestore, err)) }

// Events, latencies and retries are counted by queue; the outcomes an
// alert or a panel watches exist at zero for every partition queue from
// the start, and the journal's by-queue series too when it is on.
func TestSeriesByQueue(t *testing.T) {
	m := NewMetrics(&Health{}, config.Config{QueueCount: 2, Prefix: "transfers", JournalStream: "transfers.journal"})
	if n := count(m.events); n != 2*7 {
		t.Errorf("%d events series at start, want %d", n, 2*7)
	}
	for _, c := range []struct {
		name string
		n    int
	}{{"unprotected", count(m.unprotected)}, {"lost", count(m.lost)}, {"stalls", count(m.stalls)}} {
		if c.n != 2 {
			t.Errorf("%d %s series at start, want 2", c.n, c.name)
		}
	}
	m.Decided(consumer.Decision{Queue: "transfers.1", Action: consumer.ActionAck, Duration: time.Millisecond})
	m.Decided(consumer.Decision{Queue: "transfers.1", Action: consumer.ActionAck, Duplicate: true})
	m.Decided(consumer.Decision{Queue: "transfers.0", Action: consumer.ActionDeadLetter, Class: event.ClassPoison})
	m.Retried(consumer.Retry{Queue: "transfers.0", Attempt: 1,
		Err: event.Transient(&pq.Error{Code: "57014", Message: "canceling statement due to statement timeout"})})
	m.JournalStalled("transfers.0", 1)
	m.JournalStalled("transfers.0", 2) // the same stall
	m.JournalHeld("transfers.1", 3*time.Millisecond)
	m.JournalLost("transfers.0", 3)
	for _, c := range []struct {
		what      string
		got, want float64
	}{
		{"applied on transfers.1", value(m.events.WithLabelValues("transfers.1", "applied", "")), 1},
		{"applied on transfers.0", value(m.events.WithLabelValues("transfers.0", "applied", "")), 0},
		{"duplicates on transfers.1", value(m.events.WithLabelValues("transfers.1", "duplicate", "")), 1},
		{"poison on transfers.0", value(m.events.WithLabelValues("transfers.0", "dead_lettered", "poison")), 1},
		{"statement timeouts on transfers.0", value(m.retries.WithLabelValues("transfers.0", db.CauseStatementTimeout)), 1},
		{"stalls of transfers.0", value(m.stalls.WithLabelValues("transfers.0")), 1},
		{"lost on transfers.0", value(m.lost.WithLabelValues("transfers.0")), 3},
		{"lost on transfers.1", value(m.lost.WithLabelValues("transfers.1")), 0},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.what, c.got, c.want)
		}
	}
	if n := count(m.held); n != 2 {
		t.Errorf("%d journal hold series, want 2", n)
	}
	var h dto.Metric
	if err := m.held.WithLabelValues("transfers.1").(prometheus.Histogram).Write(&h); err != nil || h.Histogram.GetSampleCount() != 1 {
		t.Errorf("transfers.1's journal holds: %v, %v; want one", h.Histogram, err)
	}
	off := NewMetrics(&Health{}, config.Config{QueueCount: 2, Prefix: "transfers"})
	if n := count(off.held) + count(off.unprotected) + count(off.lost) + count(off.stalls); n != 0 {
		t.Errorf("%d journal series without the journal, want none", n)
	}
}

// count returns how many series c has.
func count(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 1000)
	c.Collect(ch)
	close(ch)
	return len(ch)
}

// value returns the value of c, a counter or gauge of one series.
func value(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	close(ch)
	var m dto.Metric
	if err := (<-ch).Write(&m); err != nil {
		panic(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// fqName finds a series' name in its description.
var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// A blocked queue shows since when and why, at scrape time; the others
// show 0 and no reason.
func TestBlockedQueuesShowTheirReason(t *testing.T) {
	spec := config.Config{QueueCount: 2, Prefix: "transfers", JournalStream: "transfers.journal"}
	svc := consumer.New(consumer.Config{Topology: spec.Topology()}, nil)
	h := &Health{}
	h.Service(svc)
	since := time.Unix(1_800_000_000, 0)
	svc.JournalStalled("transfers.1", since, 3, "ev-1", errors.New("the broker blocks publishing"))
	got := map[string]string{}
	ch := make(chan prometheus.Metric, 100)
	newQueueState(h, "transferconsumer", true).Collect(ch)
	close(ch)
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		key := fqName.FindStringSubmatch(m.Desc().String())[1]
		for _, l := range d.Label {
			key += " " + l.GetName() + "=" + l.GetValue()
		}
		got[key] = fmt.Sprint(d.Gauge.GetValue())
	}
	want := map[string]string{
		"transferconsumer_queue_blocked_since_seconds queue=transfers.0":                                         "0",
		"transferconsumer_queue_blocked_since_seconds queue=transfers.1":                                         "1.8e+09",
		"transferconsumer_queue_blocked_reason class=transient queue=transfers.1 reason=" + reasonJournalStalled: "1",
		"transferconsumer_journal_unrestorable_events queue=transfers.0":                                         "0",
		"transferconsumer_journal_unrestorable_events queue=transfers.1":                                         "0",
	}
	if !maps.Equal(got, want) {
		t.Errorf("scraped %v, want %v", got, want)
	}
}
