package dlq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ReplayReport says what Replay did.
type ReplayReport struct {
	Run      string // the run's id, in the x-replay-run header of every letter it put back
	Depth    int    // dead letters in the DLQ when the run started: it scans no more
	Scanned  int
	Replayed []Letter // published back (or, on a dry run, that would be)
	// Letters the filter selected that its FailedAfter left in the DLQ:
	// TooOld had failed before it, Undated show no time at all.
	TooOld, Undated int
	// Unreplayable counts, by class, the letters the filter selected and
	// left in the DLQ because their class cannot apply again (see
	// Unreplayable) and the filter did not name it.
	Unreplayable map[string]int
	// Published counts the letters published, Replayed those of them
	// confirmed and removed from the DLQ: one more was published only when
	// the run failed on it.
	Published int
	// Interrupted says the run stopped because its context ended.
	Interrupted bool
}

// Skipped counts the letters the filter selected that the run left in the
// DLQ on purpose: too old, undated, or of a class that cannot apply again.
func (r ReplayReport) Skipped() int {
	n := r.TooOld + r.Undated
	for _, k := range r.Unreplayable {
		n += k
	}
	return n
}

// Replay publishes the dead letters that match f back to the topology's
// exchange with their original routing key, at most limit of them (0: no
// limit). Each is removed from the DLQ only after the broker confirmed its
// republication, so a failure midway loses nothing: at worst a letter is both
// replayed and still in the DLQ, and the inbox makes a second replay
// harmless. With dryRun it publishes nothing and removes nothing. f's
// FailedAfter (the inbox retention's guard) leaves alone, and counts, the
// letters that failed before it and those that show no time at all. Letters
// of a class that cannot apply again (poison, producer-conflict) are left
// alone and counted too, unless f.Class names that class.
//
// A run ends: it scans no more letters than the DLQ held when it started,
// and it never replays a letter that it put back itself and that failed
// again (they carry its id in x-replay-run), so a letter that keeps failing
// goes back once per run, not until the limit.
func Replay(conn *amqp.Connection, prefix string, f Filter, limit int, dryRun bool) (ReplayReport, error) {
	return ReplayAs(conn, prefix, f, limit, dryRun, Custody{})
}

// Custody says who puts letters back, and whose replays are believed about
// a letter's first producer (adr/0008).
type Custody struct {
	// User is the user_id of every message put back: the service believes
	// the x-original-user-id a message carries only from a user in its
	// REPLAYERS, and the broker refuses a user_id that is not the
	// connection's user. Empty means the connection's user, from its URL's
	// credentials (PLAIN, AMQPLAIN); with none known (EXTERNAL) no user_id is
	// set, and with PRODUCERS set the service dead-letters the replay as
	// unauthorized.
	User string
	// Replayers are the users REPLAYERS lists, whose x-original-user-id is
	// believed in a letter the broker dead-lettered itself; User is one.
	// Spaces around a name are ignored, so REPLAYERS split at its commas
	// will do.
	Replayers []string
}

// replayer returns whether a user is one of c's replaying users.
func (c Custody) replayer(user string) bool {
	return user != "" && (user == c.User ||
		slices.ContainsFunc(c.Replayers, func(r string) bool { return strings.TrimSpace(r) == user }))
}

// connUser returns the user conn logged in as, "" when its mechanism names
// none.
func connUser(conn *amqp.Connection) string {
	if conn == nil {
		return ""
	}
	for _, a := range conn.Config.SASL {
		switch a := a.(type) {
		case *amqp.PlainAuth:
			return a.Username
		case *amqp.AMQPlainAuth:
			return a.Username
		}
	}
	return ""
}

// ReplayAs is Replay, putting each letter back with user_id c.User and its
// first producer (LetterProducer) in x-original-user-id, so that the
// service judges a replayed letter by the producer that first sent it,
// never by the replaying user.
func ReplayAs(conn *amqp.Connection, prefix string, f Filter, limit int, dryRun bool, c Custody) (ReplayReport, error) {
	return ReplayPaced(context.Background(), conn, prefix, f, limit, dryRun, c, Pace{})
}

// ReplayPaced is ReplayAs at p's rate, telling p.Progress after each letter,
// until ctx ends. An end of ctx stops the run between two letters: the
// letter being republished is confirmed and removed first, the next is
// not published, and every letter not removed goes back to the DLQ, so
// each is either confirmed republished or still in the DLQ, and a run
// started again goes on with those. The report then says Interrupted; the
// error is nil unless something failed.
func ReplayPaced(ctx context.Context, conn *amqp.Connection, prefix string, f Filter, limit int, dryRun bool,
	c Custody, p Pace) (ReplayReport, error) {
	if c.User == "" {
		c.User = connUser(conn)
	}
	r := ReplayReport{Run: newRunID()}
	ch, err := conn.Channel()
	if err != nil {
		return r, fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close() // returns anything still held, should scan fail
	var returns chan amqp.Return
	var closes chan *amqp.Error
	lim := p.limiter()
	start := time.Now()
	var depth, scanned int // as the scan goes
	r.Scanned, r.Depth, err = scanTold(ch, Queue(prefix), func(n int) { depth = n }, func(d amqp.Delivery, l Letter) (bool, bool, error) {
		scanned++
		if ctx.Err() != nil {
			r.Interrupted = true
			return false, false, nil // this letter goes back
		}
		if !r.shouldReplay(d, l, f) {
			return true, false, nil
		}
		if !dryRun {
			if lim != nil && lim.Wait(ctx) != nil {
				r.Interrupted = true
				return false, false, nil
			}
			if returns == nil {
				if err := ch.Confirm(false); err != nil {
					return false, false, fmt.Errorf("confirm mode: %w", err)
				}
				returns = ch.NotifyReturn(make(chan amqp.Return, 1))
				closes = ch.NotifyClose(make(chan *amqp.Error, 1))
			}
			r.Published++
			if err := republish(ch, returns, prefix, r.Run, c.User, LetterProducer(d, c.replayer), d, l); err != nil {
				return false, false, fmt.Errorf("replay event %s: %w", l.EventID, Explain(err, closes, prefix))
			}
			if err := d.Ack(false); err != nil {
				return false, false, fmt.Errorf("remove replayed event %s from the DLQ: %w", l.EventID, err)
			}
		}
		r.Replayed = append(r.Replayed, l)
		if p.Progress != nil {
			p.Progress(Progress{Replayed: len(r.Replayed), Scanned: scanned, Depth: depth, Elapsed: time.Since(start)})
		}
		return limit == 0 || len(r.Replayed) < limit, !dryRun, nil
	})
	return r, err
}

// shouldReplay reports whether run r should replay d, and counts in r a letter
// that f selects but for its FailedAfter, or of a class that cannot apply
// again that f does not name.
func (r *ReplayReport) shouldReplay(d amqp.Delivery, l Letter, f Filter) bool {
	unguarded := f
	unguarded.FailedAfter = time.Time{}
	if f.Class == "" && Unreplayable(l.Class) {
		if replayable(d, l, unguarded, r.Run) {
			if r.Unreplayable == nil {
				r.Unreplayable = map[string]int{}
			}
			r.Unreplayable[l.Class]++
		}
		return false
	}
	if replayable(d, l, f, r.Run) {
		return true
	}
	if replayable(d, l, unguarded, r.Run) {
		if l.since().IsZero() {
			r.Undated++
		} else {
			r.TooOld++
		}
	}
	return false
}

// replayable reports whether run should replay d: it passes f and run did
// not put it back already. Matching the run's own id, not a message id or
// a time, holds for letters without an id and for several copies of one
// event, and lets a later run replay what this one could not fix.
func replayable(d amqp.Delivery, l Letter, f Filter, run string) bool {
	by, _ := d.Headers[HeaderReplayRun].(string)
	return by != run && f.Match(l)
}

// newRunID returns a random id for one Replay run.
func newRunID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// republish sends a dead letter back to the main exchange with its original
// routing key, without its failure headers and marked as put back by run,
// as user (its user_id, when set) on behalf of producer (its
// x-original-user-id, when set), and waits for the confirm.
func republish(ch *amqp.Channel, returns <-chan amqp.Return, prefix, run, user, producer string, d amqp.Delivery, l Letter) error {
	msg := publishing(d, replayHeaders(d.Headers, run, producer, time.Now()))
	msg.UserId = user
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return PublishConfirmed(ctx, ch, returns, prefix, l.RoutingKey, msg)
}

// replayHeaders returns the headers of a letter put back by run at now: the
// letter's own, less the failure headers (x-original-user-id among them,
// whatever the letter said), with producer as x-original-user-id when set,
// and its history: x-replay-count one more than the letter's (see
// Letter.Replays), x-replayed-at now.
func replayHeaders(from amqp.Table, run, producer string, now time.Time) amqp.Table {
	headers := amqp.Table{}
	for k, v := range from {
		if strings.HasPrefix(k, "x-failure-") || strings.HasPrefix(k, "x-original-") ||
			strings.HasPrefix(k, "x-failed-") || k == "x-death" || strings.HasPrefix(k, "x-first-death-") ||
			strings.HasPrefix(k, "x-last-death-") || k == "x-delivery-count" {
			continue
		}
		headers[k] = v
	}
	n, _ := replays(from)
	headers[HeaderReplayCount] = n + 1
	headers[HeaderReplayedAt] = now.UTC().Format(time.RFC3339Nano)
	headers[HeaderReplayRun] = run
	if producer != "" {
		headers[HeaderOriginalUser] = producer
	}
	return headers
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
	case r, ok := <-returns:
		if !ok { // closed with the channel: nothing was returned
			return ErrChannelClosed
		}
		return fmt.Errorf("unroutable on exchange %q with key %q: %d %s", exchange, key, r.ReplyCode, r.ReplyText)
	default:
	}
	if !acked {
		if ch.IsClosed() { // the library nacks what was unconfirmed when the channel closed
			return ErrChannelClosed
		}
		return errors.New("broker nacked the message")
	}
	return nil
}
