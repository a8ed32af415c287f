package consumer

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"transferconsumer/event"
	"transferconsumer/retry"
)

// probed is an applier whose database probe passes, counting the probes.
type probed struct {
	Applier
	probes int
}

func (p *probed) Probe(context.Context) error { p.probes++; return nil }

// A broker session that ended with a queue held by a read of the journal
// that could not begin (a broker alarm holds its fence, and the database
// cannot vouch for the mark) is followed by the next only once the journal
// can be read, not as soon as the database answers: consuming before would
// take the same message back only to hold it again, and at the next
// consumer timeout spend one more of its deliveries (3.x, 4.0 to 4.2),
// until the delivery limit dead-letters a good event. A queue held by the
// database alone does not wait for the journal.
func TestAQueueHeldByAnUnreadableJournalWaitsForItBeforeConsuming(t *testing.T) {
	unread := event.Transient(fmt.Errorf("journal: fence: %w; and the database cannot vouch for the mark", event.ErrJournalUnread))
	for _, c := range []struct {
		name     string
		err      error
		readable int // the journal probes awaitHealthy makes, the last passing
	}{
		{"held by the journal", unread, 4},
		{"held by the database", event.Transient(errors.New("connection refused")), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			app := &probed{}
			readable := 0
			s := New(Config{Retry: retry.Backoff{Min: time.Millisecond, Max: time.Millisecond}, ApplyTimeout: time.Second,
				JournalReadable: func(context.Context) error {
					readable++
					if readable < 4 {
						return fmt.Errorf("journal: fence: %w", event.ErrJournalUnread)
					}
					return nil
				}}, app)
			s.setBlocked(Blocked{Queue: "transfers.0", Err: c.err, Reason: c.err.Error()})
			if err := s.awaitHealthy(t.Context()); err != nil {
				t.Fatal(err)
			}
			if readable != c.readable || app.probes < max(c.readable, 1) {
				t.Errorf("probes of the journal %d, of the database %d; want %d and at least %d", readable, app.probes, c.readable, max(c.readable, 1))
			}
			if b := s.blocked(); len(b) != 0 {
				t.Errorf("still blocked after the probes passed: %+v", b)
			}
		})
	}
}
