package dlq

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Group counts the dead letters of one class and reason.
type Group struct {
	Class, Reason string
	Count         int
}

// Summary is what List found in the dead-letter queue.
type Summary struct {
	Total   int
	Groups  []Group  // largest first
	Letters []Letter // the first ones, in queue order
}

// List reads every dead letter of the topology with prefix without removing
// any: it holds them unacknowledged while it reads and then returns them all.
// The DLQ has no delivery limit, so returning them never drops one (on 3.x
// they go back to the tail, so the order rotates). It keeps the first `first`
// letters in the summary.
func List(conn *amqp.Connection, prefix string, first int) (Summary, error) {
	var s Summary
	counts := map[[2]string]int{}
	_, err := scan(conn, prefix, func(_ *amqp.Channel, d amqp.Delivery, l Letter) (bool, bool, error) {
		s.Total++
		counts[[2]string{l.Class, l.Reason}]++
		if len(s.Letters) < first {
			s.Letters = append(s.Letters, l)
		}
		return true, false, nil
	})
	for k, n := range counts {
		s.Groups = append(s.Groups, Group{Class: k[0], Reason: k[1], Count: n})
	}
	sort.Slice(s.Groups, func(i, j int) bool {
		if s.Groups[i].Count != s.Groups[j].Count {
			return s.Groups[i].Count > s.Groups[j].Count
		}
		return s.Groups[i].Class+s.Groups[i].Reason < s.Groups[j].Class+s.Groups[j].Reason
	})
	return s, err
}

// ReplayReport says what Replay did.
type ReplayReport struct {
	Scanned  int
	Replayed []Letter // published back (or, on a dry run, that would be)
}

// Replay publishes the dead letters that match f back to the topology's
// exchange with their original routing key, at most limit of them (0: no
// limit). Each is removed from the DLQ only after the broker confirmed its
// republication, so a failure midway loses nothing: at worst a letter is both
// replayed and still in the DLQ, and the inbox makes a second replay
// harmless. With dryRun it publishes nothing and removes nothing.
func Replay(conn *amqp.Connection, prefix string, f Filter, limit int, dryRun bool) (ReplayReport, error) {
	var r ReplayReport
	var returns chan amqp.Return
	scanned, err := scan(conn, prefix, func(ch *amqp.Channel, d amqp.Delivery, l Letter) (bool, bool, error) {
		if !f.Match(l) {
			return true, false, nil
		}
		if !dryRun {
			if returns == nil {
				if err := ch.Confirm(false); err != nil {
					return false, false, fmt.Errorf("confirm mode: %w", err)
				}
				returns = ch.NotifyReturn(make(chan amqp.Return, 1))
			}
			if err := republish(ch, returns, prefix, d, l); err != nil {
				return false, false, fmt.Errorf("replay event %s: %w", l.EventID, err)
			}
			if err := d.Ack(false); err != nil {
				return false, false, fmt.Errorf("remove replayed event %s from the DLQ: %w", l.EventID, err)
			}
		}
		r.Replayed = append(r.Replayed, l)
		return limit == 0 || len(r.Replayed) < limit, !dryRun, nil
	})
	r.Scanned = scanned
	return r, err
}

// scan gets the DLQ's messages one by one on its own channel, holding each
// unacknowledged (so the next get returns the next message), and calls visit
// until it says there is no more to do or the queue has no more. visit may
// ack a message and says so; every message it did not ack is returned to the
// DLQ at the end, with one nack of the highest delivery tag still held (a
// multiple nack naming a tag already acked would be refused and close the
// channel).
func scan(conn *amqp.Connection, prefix string,
	visit func(*amqp.Channel, amqp.Delivery, Letter) (more, acked bool, err error)) (int, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close() // returns anything still held, should the nack below fail
	queue := Queue(prefix)
	n := 0
	var held uint64 // the highest delivery tag not acked
	var visitErr error
	for {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			return n, fmt.Errorf("get from %s: %w", queue, err)
		}
		if !ok {
			break
		}
		n++
		more, acked, err := visit(ch, d, Describe(d))
		if !acked {
			held = d.DeliveryTag
		}
		if err != nil {
			visitErr = err
			break
		}
		if !more {
			break
		}
	}
	if held > 0 {
		if err := ch.Nack(held, true, true); err != nil { // multiple, requeue
			return n, errors.Join(visitErr, fmt.Errorf("return unreplayed letters to %s: %w", queue, err))
		}
	}
	return n, visitErr
}

// republish sends a dead letter back to the main exchange with its original
// routing key and without its failure headers, and waits for the confirm.
func republish(ch *amqp.Channel, returns <-chan amqp.Return, prefix string, d amqp.Delivery, l Letter) error {
	headers := amqp.Table{}
	for k, v := range d.Headers {
		if strings.HasPrefix(k, "x-failure-") || strings.HasPrefix(k, "x-original-") ||
			strings.HasPrefix(k, "x-failed-") || k == "x-death" || strings.HasPrefix(k, "x-first-death-") ||
			strings.HasPrefix(k, "x-last-death-") || k == "x-delivery-count" {
			continue
		}
		headers[k] = v
	}
	headers[HeaderReplayedAt] = time.Now().UTC().Format(time.RFC3339Nano)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return PublishConfirmed(ctx, ch, returns, prefix, l.RoutingKey, publishing(d, headers))
}

// PublishConfirmed publishes msg as mandatory on ch, which must be in confirm
// mode with returns registered for basic.return, and waits for the broker's
// confirm. It returns nil only when the broker confirmed the message and did
// not return it as unroutable. One message at a time per channel: a return
// arrives before the confirm of the same message, so it is in returns by the
// time the confirm is.
func PublishConfirmed(ctx context.Context, ch *amqp.Channel, returns <-chan amqp.Return,
	exchange, key string, msg amqp.Publishing) error {
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key,
		true,  // mandatory: an unroutable message comes back instead of vanishing
		false, // immediate
		msg)
	if err != nil {
		return err
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		return err
	}
	select {
	case r := <-returns:
		return fmt.Errorf("unroutable on exchange %q with key %q: %d %s", exchange, key, r.ReplyCode, r.ReplyText)
	default:
	}
	if !acked {
		return errors.New("broker nacked the message")
	}
	return nil
}
