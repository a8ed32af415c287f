package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"transferconsumer/config"
	"transferconsumer/dlq"
)

// A reader of the DLQ gets its letters one by one with basic.get and holds
// each unacknowledged until it is done (dlq/scan.go): a letter that another
// reader holds at that moment (another dlq command, a replay waiting for
// its confirms, the management UI's "Get messages") is not ready, so it is
// never got, and a passive declare does not count it either. The broker's
// own count of ready plus unacknowledged letters, from the management API,
// is what tells a run that it did not see everything.

// dlqCount is the broker's count of the DLQ set against what a read got:
// the letters it counts that the read did not see.
type dlqCount struct {
	Checked bool   `json:"checked"`       // the broker's count was read
	Why     string `json:"why,omitempty"` // why it was not
	Broker  int64  `json:"broker_count"`  // letters in the DLQ, ready or held
	Held    int64  `json:"held"`          // of those, unacknowledged
	Unseen  int    `json:"unseen"`        // counted by the broker, not got by the read
}

// countDLQ compares seen, the letters a read got, with the broker's
// count of the DLQ, read through MANAGEMENT_URL's API right after the read
// (the count of ready plus held letters does not change as readers get and
// return them; letters that arrive or leave meanwhile can make it differ
// for up to the broker's statistics interval, 5 s by default).
func countDLQ(cfg config.Config, seen int) dlqCount {
	m := cfg.Management()
	if m == nil {
		return dlqCount{Why: "MANAGEMENT_URL is not set, so letters another reader holds cannot be counted"}
	}
	urls, err := cfg.BrokerURLs()
	if err != nil || len(urls) == 0 {
		return dlqCount{Why: fmt.Sprintf("the broker URL: %v", errors.Join(err, errors.New("none")))}
	}
	c, ok, err := m.Count(context.Background(), urls[0], dlq.Queue(cfg.Prefix))
	switch {
	case err != nil:
		return dlqCount{Why: fmt.Sprintf("the broker's count could not be read: %s", config.RedactErr(err))}
	case !ok:
		return dlqCount{Why: "the management API has no count for the DLQ yet"}
	}
	return dlqCount{Checked: true, Broker: c.Messages, Held: c.Unacked, Unseen: max(0, int(c.Messages)-seen)}
}

// againstScanned is s for a run that saw depth letters when it started (replay
// and drop, whose own work changes the DLQ's count: their count is read
// as they start, and compared with the depth they scanned).
func (s dlqCount) againstScanned(depth int) dlqCount {
	if s.Checked {
		s.Unseen = max(0, int(s.Broker)-depth)
	}
	return s
}

// printUnseen prints what s says, if anything, as a line of its own.
func (s dlqCount) printUnseen(w io.Writer) {
	if line := s.String(); line != "" {
		fmt.Fprintln(w, line)
	}
}

// String says what the read could not see, and why; "" when it saw all
// the broker counts.
func (s dlqCount) String() string {
	switch {
	case !s.Checked:
		return "not checked whether another reader holds letters: " + s.Why
	case s.Unseen == 0:
		return ""
	case s.Held >= int64(s.Unseen):
		return fmt.Sprintf("%d dead letter(s) not seen: held by another reader (the broker counts %d, %d of them unacknowledged: "+
			"another dlq command, a replay waiting for its confirms, or the management UI's Get messages); run again once it lets go",
			s.Unseen, s.Broker, s.Held)
	default:
		return fmt.Sprintf("%d dead letter(s) not seen: the broker counts %d (%d unacknowledged); letters that arrived or left "+
			"within its statistics interval (5 s by default) can explain it: run again", s.Unseen, s.Broker, s.Held)
	}
}

// readWholeDLQ reads the DLQ with read until it sees every letter the
// broker counts, or until wait has passed, looking again every second;
// it returns the last read's result and the count it was set against.
func readWholeDLQ[T any](cfg config.Config, wait time.Duration, read func() (T, int, error)) (T, dlqCount, error) {
	deadline := time.Now().Add(wait)
	for {
		r, seen, err := read()
		if err != nil {
			return r, dlqCount{}, err
		}
		s := countDLQ(cfg, seen)
		if s.Unseen == 0 || !time.Now().Before(deadline) {
			return r, s, nil
		}
		time.Sleep(min(time.Second, time.Until(deadline)))
	}
}
