package dlq

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Recorder keeps a dead letter somewhere that outlives the DLQ. Drop
// removes a letter only after Record returned nil for it.
type Recorder interface {
	Record(d amqp.Delivery, l Letter) error
}

// DropReport says what Drop did.
type DropReport struct {
	Depth   int // dead letters in the DLQ when the run started: it scans no more
	Scanned int
	Dropped []Letter // recorded and removed (or, on a dry run, that would be)
}

// Drop removes from the DLQ of the topology with prefix the dead letters
// that match f, at most limit of them (0: no limit), each only after rec
// recorded it: a letter whose record fails stays in the DLQ, and the run
// stops there with that error. A failed ack after a good record leaves the
// letter both recorded and in the DLQ, never gone unrecorded. With dryRun it
// records nothing and removes nothing, and rec may be nil.
//
// Like Replay, a run scans no more letters than the DLQ held when it
// started, and returns every letter it does not drop to the queue.
func Drop(conn *amqp.Connection, prefix string, f Filter, limit int, dryRun bool, rec Recorder) (DropReport, error) {
	var r DropReport
	ch, err := conn.Channel()
	if err != nil {
		return r, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close() // returns anything still held, should scan fail
	r.Scanned, r.Depth, err = scan(ch, Queue(prefix), func(d amqp.Delivery, l Letter) (bool, bool, error) {
		if !f.Match(l) {
			return true, false, nil
		}
		if !dryRun {
			if err := rec.Record(d, l); err != nil {
				return false, false, fmt.Errorf("record event %s (left in the DLQ): %w", orNone(l.EventID), err)
			}
			if err := d.Ack(false); err != nil {
				return false, false, fmt.Errorf("remove recorded event %s from the DLQ: %w", orNone(l.EventID), err)
			}
		}
		r.Dropped = append(r.Dropped, l)
		return limit == 0 || len(r.Dropped) < limit, !dryRun, nil
	})
	return r, err
}

func orNone(id string) string {
	if id == "" {
		return "(no id)"
	}
	return id
}
