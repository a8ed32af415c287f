package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/dlq"
)

// letters publishes dead-letter copies on a broker connection of their own.
// Under a memory or disk alarm the broker stops reading from every
// connection that publishes: were the copies sent on the consuming
// connection, one poison message would stall the acks of every queue, just
// when draining would relieve the broker. On a connection of their own,
// the alarm holds back the dead letters only, and those the worker parks in
// the database instead (adr/0002): every queue goes on.
type letters struct {
	urls  func() ([]string, error) // the broker's nodes, asked at each dial (Config.urls)
	first int                      // the node to try first: the consuming connection's
	name  string
	log   *slog.Logger

	mu   sync.Mutex
	conn *amqp.Connection // nil until the first dead letter, and after it closed

	alarm   atomic.Pointer[string] // the broker's reason while it blocks the connection
	alarmMu sync.Mutex
	alarmed chan struct{} // closed while an alarm blocks the connection
	// unblocked, when set, is called when an alarm passes: parked dead
	// letters can go out.
	unblocked func()
}

// alarmOn returns a channel that is closed while a broker alarm blocks
// the connection (at once if one does now).
func (p *letters) alarmOn() <-chan struct{} {
	p.alarmMu.Lock()
	defer p.alarmMu.Unlock()
	if p.alarmed == nil {
		p.alarmed = make(chan struct{})
	}
	return p.alarmed
}

func (p *letters) setAlarm(on bool) {
	p.alarmMu.Lock()
	defer p.alarmMu.Unlock()
	if p.alarmed == nil {
		p.alarmed = make(chan struct{})
	}
	select {
	case <-p.alarmed:
		if !on {
			p.alarmed = make(chan struct{})
		}
	default:
		if on {
			close(p.alarmed)
		}
	}
}

// channel returns a new channel in confirm mode with its returns and its
// close registered, on the connection, which it dials when there is none yet or
// the last one closed. A blocked connection (a resource alarm) answers no
// channel.open until the alarm passes: the wait ends with ctx, and a
// channel that opens later is closed.
func (p *letters) channel(ctx context.Context) (*amqp.Channel, <-chan amqp.Return, <-chan *amqp.Error, error) {
	conn, err := p.connection()
	if err != nil {
		return nil, nil, nil, err
	}
	type opened struct {
		ch      *amqp.Channel
		returns <-chan amqp.Return
		closes  <-chan *amqp.Error
		err     error
	}
	done := make(chan opened, 1)
	go func() {
		ch, err := conn.Channel()
		if err != nil {
			done <- opened{err: fmt.Errorf("open dead-letter channel: %w", err)}
			return
		}
		if err := ch.Confirm(false); err != nil {
			done <- opened{err: fmt.Errorf("confirm mode: %w", err)}
			return
		}
		done <- opened{ch: ch, returns: ch.NotifyReturn(make(chan amqp.Return, 1)),
			closes: ch.NotifyClose(make(chan *amqp.Error, 1))}
	}()
	select {
	case o := <-done:
		return o.ch, o.returns, o.closes, o.err
	case <-ctx.Done():
		go func() { // closed by the session's end at the latest
			if o := <-done; o.ch != nil {
				_ = o.ch.Close()
			}
		}()
		return nil, nil, nil, fmt.Errorf("open dead-letter channel: %w", context.Cause(ctx))
	}
}

// connection returns the connection, dialled when there is none yet or the
// last one closed.
func (p *letters) connection() (*amqp.Connection, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil || p.conn.IsClosed() {
		urls, err := p.urls()
		if err != nil {
			return nil, fmt.Errorf("connect for dead letters: %w", err)
		}
		conn, _, err := Dial(urls, p.first, p.name)
		if err != nil {
			return nil, fmt.Errorf("connect for dead letters: %w", err)
		}
		blocked := conn.NotifyBlocked(make(chan amqp.Blocking, 1))
		go p.watch(blocked) // read until the connection closes, or it would stall
		p.conn = conn
	}
	return p.conn, nil
}

// letterChannel is one goroutine's channel on the dead-letter connection,
// opened at its first dead letter and again after it closed. It is the
// worker's letterPort.
type letterChannel struct {
	letters *letters
	ch      *amqp.Channel
	returns <-chan amqp.Return
	closes  <-chan *amqp.Error // the broker's reason, should it close the channel
}

// alarmed reports whether a broker alarm blocks publishing now.
func (c *letterChannel) alarmed() bool {
	return isClosed(c.letters.alarmOn())
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// publish publishes msg and returns nil only once the broker confirmed it
// (and did not return it as unroutable), waiting as long as ctx lasts.
// When the broker refuses it because the user may not write to the
// exchange, it closes the channel: the error is then a *dlq.Refused, which
// names the permission to grant, not the nack the library makes of it.
//
// Unless force, an alarm that starts while the confirm is awaited ends the
// wait with an *alarmCut: the channel is left to that publish, whose
// answer the error carries, so that the letter parked instead is held back
// from the drain until it comes, and dropped should it be a confirm.
func (c *letterChannel) publish(ctx context.Context, exchange, key string, msg amqp.Publishing, force bool) error {
	if c.ch == nil || c.ch.IsClosed() {
		if err := c.open(ctx, force); err != nil {
			return err
		}
	}
	if force {
		return dlq.Explain(dlq.PublishConfirmed(ctx, c.ch, c.returns, exchange, key, msg), c.closes, exchange)
	}
	dc, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key,
		true,  // mandatory: an unroutable message comes back instead of vanishing
		false, // immediate
		msg)
	if err != nil {
		return dlq.Explain(err, c.closes, exchange)
	}
	ch, returns, closes := c.ch, c.returns, c.closes
	result := make(chan error, 1)
	go func() { // ends when the broker answers or the channel closes
		acked := dc.Wait()
		result <- confirmed(ch, returns, closes, acked, exchange, key)
	}()
	select {
	case err := <-result:
		return err
	case <-c.letters.alarmOn():
		c.ch, c.returns, c.closes = nil, nil, nil // the next publish opens another
		return &alarmCut{answer: result}
	case <-ctx.Done():
		c.ch, c.returns, c.closes = nil, nil, nil
		go func() { <-result; _ = ch.Close() }()
		return context.Cause(ctx)
	}
}

// open opens the channel. A blocked connection answers no channel.open
// until the alarm passes: unless force, the alarm ends the wait, with
// errAlarmCut (nothing was published).
func (c *letterChannel) open(ctx context.Context, force bool) error {
	if !force {
		octx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { // ends with octx at the latest
			select {
			case <-c.letters.alarmOn():
				cancel()
			case <-octx.Done():
			}
		}()
		var err error
		if c.ch, c.returns, c.closes, err = c.letters.channel(octx); err != nil {
			if ctx.Err() == nil && isClosed(c.letters.alarmOn()) {
				return fmt.Errorf("%w: %w", errAlarmCut, err)
			}
			return err
		}
		return nil
	}
	var err error
	c.ch, c.returns, c.closes, err = c.letters.channel(ctx)
	return err
}

// confirmed is what the broker's answer to a publish means: nil when it
// confirmed it and did not return it.
func confirmed(ch *amqp.Channel, returns <-chan amqp.Return, closes <-chan *amqp.Error, acked bool, exchange, key string) error {
	select {
	case r, ok := <-returns:
		if !ok {
			return dlq.Explain(dlq.ErrChannelClosed, closes, exchange)
		}
		return fmt.Errorf("unroutable on exchange %q with key %q: %d %s", exchange, key, r.ReplyCode, r.ReplyText)
	default:
	}
	if !acked {
		if ch.IsClosed() {
			return dlq.Explain(dlq.ErrChannelClosed, closes, exchange)
		}
		return errors.New("broker nacked the message")
	}
	return nil
}

// watch follows the broker's connection.blocked and unblocked until the
// connection closes.
func (p *letters) watch(blocked <-chan amqp.Blocking) {
	for b := range blocked {
		if b.Active {
			reason := b.Reason
			p.alarm.Store(&reason)
			p.setAlarm(true)
			p.log.Warn("broker blocks publishing (resource alarm): dead letters are parked in the database until it passes", "reason", reason)
		} else {
			p.alarm.Store(nil)
			p.setAlarm(false)
			p.log.Info("broker unblocked publishing")
			if p.unblocked != nil {
				p.unblocked()
			}
		}
	}
	p.alarm.Store(nil)
	p.setAlarm(false)
}

// blockedBy returns the broker's reason for blocking the connection, or "".
func (p *letters) blockedBy() string {
	if r := p.alarm.Load(); r != nil {
		return *r
	}
	return ""
}

// close closes the connection. A blocked connection does not read the
// close either, so it is given a second and then dropped.
func (p *letters) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn != nil {
		_ = p.conn.CloseDeadline(time.Now().Add(time.Second))
		p.conn = nil
	}
}

// Dial opens a broker connection named name in the management UI to the
// first of urls that answers, trying them in turn from urls[first], and
// returns it with the index of the URL it used. A cluster's nodes are
// listed so that losing one does not stop the service. When none answers,
// the error names each failure.
func Dial(urls []string, first int, name string) (*amqp.Connection, int, error) {
	var errs []error
	for k := range urls {
		i := (first + k) % len(urls)
		conn, err := amqp.DialConfig(urls[i], amqp.Config{
			Properties: amqp.Table{"connection_name": name},
			Heartbeat:  10 * time.Second,
			Locale:     "en_US",
		})
		if err == nil {
			return conn, i, nil
		}
		if len(urls) > 1 {
			err = fmt.Errorf("node %d of %d: %w", i+1, len(urls), err)
		}
		errs = append(errs, err)
	}
	return nil, 0, errors.Join(errs...)
}
