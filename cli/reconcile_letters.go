package cli

import (
	"io"
	"math"
	"time"

	"transferconsumer/config"
	"transferconsumer/dlq"
)

// The dead-letter queue's side of a reconciliation: the letters whose
// replay the inbox can no longer prove harmless (adr/0003).

// deadLetters is what reconcile saw of the dead-letter queue.
type deadLetters struct {
	Read        bool         `json:"read"`
	Error       string       `json:"error,omitempty"` // why it was not read
	Total       int          `json:"total"`
	Old         int          `json:"older_than_inbox_ttl"`
	Undated     int          `json:"undated"`
	Letters     []deadLetter `json:"letters"` // the first old or undated ones
	BrokerCount dlqCount     `json:"sight"`   // the broker's count against what the read got (the key is kept for existing readers)
}

type deadLetter struct {
	EventID    string     `json:"event_id"`
	Class      string     `json:"class"`
	Reason     string     `json:"reason"`
	Queue      string     `json:"queue"`
	RoutingKey string     `json:"routing_key"`
	DeadSince  *time.Time `json:"dead_since"` // nil: the letter shows no time
}

// readDeadLetters counts the dead letters that failed longer ago than
// INBOX_TTL, and those that show no time at all: replay leaves both alone
// (adr/0003), since the inbox may have forgotten an event they hold. It
// reads the DLQ as dlq list does, returning every letter in place, and
// again, for up to wait, while the broker counts letters it did not see.
//
// The service's periodic run (periodic) reads only where guardDLQ can look
// without a declare the user may not be allowed: through the management
// API, or with DECLARE_TOPOLOGY=true, whose declare at start already
// proved the DLQ's arguments the service's. Otherwise a refused declare
// would log a channel error on the broker at every run, and a read without
// the check could spend a letter's deliveries run after run.
func readDeadLetters(cfg config.Config, first int, wait time.Duration, periodic bool) deadLetters {
	if periodic && !cfg.DeclareTopology && cfg.Management() == nil {
		return deadLetters{Error: "not read: with DECLARE_TOPOLOGY=false the periodic run reads the DLQ only with MANAGEMENT_URL set, " +
			"to check without a declare that reading spends no delivery of its letters"}
	}
	conn, err := dial(cfg, "reconcile")
	if err != nil {
		return deadLetters{Error: "not read: " + err.Error()}
	}
	defer conn.Close()
	if err := guardDLQ(cfg, conn, false, io.Discard); err != nil {
		return deadLetters{Error: "not read: " + err.Error()}
	}
	s, seen, err := readWholeDLQ(cfg, wait, func() (dlq.Summary, int, error) {
		s, err := dlq.List(conn, cfg.Prefix, math.MaxInt)
		return s, s.Total, err
	})
	if err != nil {
		return deadLetters{Error: "not read: " + err.Error()}
	}
	d := deadLetters{Read: true, Total: s.Total, BrokerCount: seen}
	cutoff := time.Now().Add(-cfg.InboxTTL)
	for _, l := range s.Letters {
		since := l.DeadSince
		if since.IsZero() {
			since = l.FailedAt
		}
		switch {
		case since.IsZero():
			d.Undated++
		case since.Before(cutoff):
			d.Old++
		default:
			continue
		}
		if len(d.Letters) < first {
			dl := deadLetter{EventID: l.EventID, Class: l.Class, Reason: l.Reason, Queue: l.Queue, RoutingKey: l.RoutingKey}
			if !since.IsZero() {
				dl.DeadSince = &since
			}
			d.Letters = append(d.Letters, dl)
		}
	}
	return d
}

// oldLetters is the count of dead letters replay cannot prove harmless, -1
// when the DLQ was not read.
func oldLetters(d deadLetters) int {
	if !d.Read {
		return -1
	}
	return d.Old + d.Undated
}
