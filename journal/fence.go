package journal

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/event"
)

// unreadError: a read of the stream could not begin, so it read
// nothing: its fence was not confirmed (a broker alarm holds it, the
// stream does not answer), or the stream could not be consumed.
type unreadError struct{ err error }

func (e *unreadError) Error() string { return e.err.Error() }
func (e *unreadError) Unwrap() error { return e.err }

// Is makes every unreadError an event.ErrJournalUnread, for the service,
// which holds a queue blocked by one back until the journal is readable.
func (e *unreadError) Is(target error) bool { return target == event.ErrJournalUnread }

// Readable returns nil once a read of the stream can begin (its fence is
// confirmed, and the stream is consumed on the reading connection), and
// otherwise an error that is an event.ErrJournalUnread; it reads no entry.
// The service probes it before it consumes again after a broker session
// ended with a queue held by a read that could not begin: consuming before
// would take the same message back only to hold it again, until the next
// consumer timeout spent one more of its deliveries.
func (j *Journal) Readable(ctx context.Context) error {
	return j.readAll(ctx, time.Now(), nil)
}

// fenceFor bounds how long a read waits for its fence's confirm while the
// broker does not block the journal's publishes.
const fenceFor = 10 * time.Second

// awaitFence waits for the answer a to a read's fence, published on ch:
// fenceFor at most, and not at all once the broker blocks the journal's
// publishes (connection.blocked comes once a publish meets an alarm),
// since it would hold the fence until the alarm passes. The channel stays
// then, as for a write the alarm holds (answer): the fence's confirm
// comes after the alarm, answered to no one.
func (j *Journal) awaitFence(ctx context.Context, ch *amqp.Channel, a <-chan error) error {
	wait, cancel := context.WithTimeout(ctx, fenceFor)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			if !j.isBlocked() {
				continue
			}
			return fmt.Errorf("journal %s: %w", j.cfg.Stream, errBlocked)
		case err := <-a:
			return j.answered(ch, err)
		case <-wait.Done():
			return j.answer(wait, ch, a)
		}
	}
}

// readChannel opens a channel to read the stream on, on the journal's
// reading connection, which never publishes: the broker blocks a
// connection that publishes during an alarm, and then reads nothing more
// from it, not even a channel.open, while one that only consumes goes on.
// (A connection opened during an alarm gets its first publish through
// before it is blocked: a read's fence can be confirmed then, and the
// read must still be able to follow it.)
func (j *Journal) readChannel() (*amqp.Channel, error) {
	j.readMu.Lock()
	defer j.readMu.Unlock()
	if j.readConn == nil || j.readConn.IsClosed() {
		conn, err := j.cfg.Dial()
		if err != nil {
			return nil, err
		}
		j.readConn = conn
	}
	ch, err := j.readConn.Channel()
	if err != nil {
		j.readConn.Close()
		j.readConn = nil
	}
	return ch, err
}
