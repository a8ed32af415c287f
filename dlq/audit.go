package dlq

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Run is what one replay or drop did, as the audit log keeps it: one JSON
// object a line, so that an auditor can say what was put back or removed,
// by whom and when, and what came back after.
type Run struct {
	Command    string    `json:"command"`       // replay or drop
	Run        string    `json:"run,omitempty"` // replay: its id, in x-replay-run of every letter it put back
	User       string    `json:"user"`          // who ran it: the operating system's user
	BrokerUser string    `json:"brokerUser,omitempty"`
	Host       string    `json:"host,omitempty"`
	Queue      string    `json:"queue"` // the DLQ
	Started    time.Time `json:"started"`
	Ended      time.Time `json:"ended"`
	Filter     RunFilter `json:"filter"`
	Depth      int       `json:"depth"`   // letters the DLQ held when it started
	Scanned    int       `json:"scanned"` // of those, the ones read
	// Replayed counts the letters published, Confirmed those of them
	// the broker confirmed and that were removed from the DLQ (replay);
	// Dropped the letters recorded and removed (drop).
	Replayed  int `json:"replayed"`
	Confirmed int `json:"confirmed"`
	Dropped   int `json:"dropped"`
	// Skipped counts the letters the filter selected and the run left
	// on purpose (too old, undated, of a class that cannot apply again),
	// Left the letters the DLQ held at the start that it did not read.
	Skipped int `json:"skipped"`
	Left    int `json:"left"`
	// EventIDs are the letters that went: confirmed republished, or
	// dropped ("" for a letter without one).
	EventIDs    []string `json:"eventIds"`
	Interrupted bool     `json:"interrupted,omitempty"`
	Error       string   `json:"error,omitempty"`
}

// RunFilter is the selection a run was given.
type RunFilter struct {
	Group       string     `json:"group,omitempty"`
	Class       string     `json:"class,omitempty"`
	Reason      string     `json:"reason,omitempty"`
	EventID     string     `json:"eventId,omitempty"`
	FailedAfter *time.Time `json:"failedAfter,omitempty"`
	Limit       int        `json:"limit,omitempty"`
	Rate        float64    `json:"rate,omitempty"` // replay: letters a second, 0 for no limit
}

// NewRunFilter returns f and the run's limit and rate as the audit log
// writes them.
func NewRunFilter(f Filter, limit int, rate float64) RunFilter {
	rf := RunFilter{Group: f.Group, Class: f.Class, Reason: f.Reason, EventID: f.EventID, Limit: limit, Rate: rate}
	if !f.FailedAfter.IsZero() {
		at := f.FailedAfter.UTC()
		rf.FailedAfter = &at
	}
	return rf
}

// ReplayRun returns what r did as a Run.
func ReplayRun(r ReplayReport, queue string) Run {
	run := Run{Command: "replay", Run: r.Run, Queue: queue, Depth: r.Depth, Scanned: r.Scanned,
		Replayed: r.Published, Confirmed: len(r.Replayed), Skipped: r.Skipped(), Left: max(0, r.Depth-r.Scanned),
		EventIDs: eventIDs(r.Replayed), Interrupted: r.Interrupted}
	return run
}

// DropRun returns what r did as a Run.
func DropRun(r DropReport, queue string) Run {
	return Run{Command: "drop", Queue: queue, Depth: r.Depth, Scanned: r.Scanned, Dropped: len(r.Dropped),
		Left: max(0, r.Depth-r.Scanned), EventIDs: eventIDs(r.Dropped)}
}

func eventIDs(ls []Letter) []string {
	ids := make([]string, len(ls))
	for i, l := range ls {
		ids[i] = l.EventID
	}
	return ids
}

// ConnUser returns the broker user conn logged in as, "" when its
// mechanism names none.
func ConnUser(conn *amqp.Connection) string { return connUser(conn) }

// AppendRun writes run as one line of JSON to w, in one write, synced when
// w is a regular file, and cut off again when that fails, so the log never
// keeps half a line.
func AppendRun(w io.Writer, run Run) error {
	line, err := json.Marshal(run)
	if err != nil {
		return fmt.Errorf("encode the run's record: %w", err)
	}
	return appendLine(w, append(line, '\n'))
}

// appendLine writes line to w in one write; when w is a regular file it is
// synced before appendLine returns, and a failed write or sync is cut off
// again, so the file never keeps half a line.
func appendLine(w io.Writer, line []byte) error {
	f, ok := w.(*os.File)
	if ok {
		if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
			ok = false // a pipe or a terminal: nothing to sync or cut
		}
	}
	if !ok {
		if _, err := w.Write(line); err != nil {
			return fmt.Errorf("write the record: %w", err)
		}
		return nil
	}
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("write the record to %s: %w", f.Name(), err)
	}
	if _, err = f.Write(line); err == nil {
		err = f.Sync()
	}
	if err != nil {
		_ = f.Truncate(fi.Size()) // appended: what was there before stays whole
		return fmt.Errorf("write the record to %s: %w", f.Name(), err)
	}
	return nil
}
