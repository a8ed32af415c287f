package journal

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"transferconsumer/retry"
)

// appender writes a lane's entries to the stream after their transaction
// committed, in the order the transactions committed, while the lane's
// worker goes on with the next transaction: the worker acks a
// transaction's events only once Journaled says its entries are confirmed
// (adr/0014). What is queued when a write begins goes in that write
// together. A write that fails is tried again in place, the same entries
// with the same sequences, until the broker confirms them or the lane
// closes: a later transaction's entries never reach the stream before an
// earlier one's, and nothing is acked meanwhile. A lane closed with
// entries unconfirmed leaves their sequences unused in the stream; their
// events, never acked, come back to the queue, and are journaled then as
// duplicates, under new sequences.
type appender struct {
	j     store
	queue string
	log   *slog.Logger
	// stalled is told of each write the stream did not take, healed of
	// the first it took after, or of the lane closing meanwhile (the
	// lane's Stalled and Healed).
	stalled func(since time.Time, attempts int, first Entry, err error)
	healed  func()

	mu      sync.Mutex
	waiting []outgoing    // queued, oldest first, not yet in a write
	last    chan struct{} // closed once everything queued so far is confirmed
	running bool          // the goroutine that writes runs
	wake    chan struct{}
	stop    context.CancelFunc
	exited  chan struct{}
}

// outgoing is one transaction's entries, and what is closed once the
// broker confirmed them.
type outgoing struct {
	entries   []Entry
	journaled chan struct{}
}

// writeRetry paces the writes tried again.
var writeRetry = retry.Backoff{Min: 50 * time.Millisecond, Max: 5 * time.Second}

// add queues entries, and returns what is closed once they are confirmed.
func (a *appender) add(entries []Entry) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	o := outgoing{entries: entries, journaled: make(chan struct{})}
	a.waiting = append(a.waiting, o)
	a.last = o.journaled
	if !a.running {
		a.running = true
		if a.wake == nil {
			a.wake, a.exited = make(chan struct{}, 1), make(chan struct{})
			ctx, stop := context.WithCancel(context.Background())
			a.stop = stop
			go a.run(ctx)
		}
	}
	select {
	case a.wake <- struct{}{}:
	default:
	}
	return o.journaled
}

// journaled returns what is closed once every entry queued so far is
// confirmed: nil when all are.
func (a *appender) journaled() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.running {
		return nil
	}
	return a.last
}

// flush waits until every entry queued so far is confirmed, or ctx ends.
func (a *appender) flush(ctx context.Context) error {
	if c := a.journaled(); c != nil {
		select {
		case <-c:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// busy reports whether entries are on their way.
func (a *appender) busy() bool { return a.journaled() != nil }

// close stops the writes: what is unconfirmed stays so.
func (a *appender) close() {
	a.mu.Lock()
	stop, exited := a.stop, a.exited
	a.mu.Unlock()
	if stop != nil {
		stop()
		<-exited
	}
}

func (a *appender) run(ctx context.Context) {
	defer close(a.exited)
	for {
		a.mu.Lock()
		batch := a.waiting
		a.waiting = nil
		if len(batch) == 0 {
			a.running = false
			a.mu.Unlock()
			select {
			case <-a.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		a.mu.Unlock()
		var entries []Entry
		for _, o := range batch {
			entries = append(entries, o.entries...)
		}
		if !a.write(ctx, entries) {
			return
		}
		for _, o := range batch {
			close(o.journaled)
		}
	}
}

// write appends entries until the broker confirms them; false when the
// lane closed first.
func (a *appender) write(ctx context.Context, entries []Entry) bool {
	var th retry.Throttle
	var since time.Time
	for attempt := 0; ; attempt++ {
		err := a.j.Append(ctx, entries)
		if err == nil {
			if attempt > 0 {
				a.log.Info("journal: the stream took the entries it had refused", "queue", a.queue,
					"from_seq", entries[0].Seq, "attempts", attempt+1)
				a.healed()
			}
			return true
		}
		if ctx.Err() != nil {
			if attempt > 0 {
				a.healed() // the lane closes: no one waits on its entries now
			}
			return false
		}
		if attempt == 0 {
			since = time.Now()
		}
		a.stalled(since, attempt+1, entries[0], err)
		if due, _ := th.Due(attempt+1, err.Error()); due {
			a.log.Warn("journal: the stream did not take a transaction's entries; its events are not acked, and the write is tried again",
				"queue", a.queue, "from_seq", entries[0].Seq, "to_seq", entries[len(entries)-1].Seq,
				"attempt", attempt+1, "err", err)
		}
		t := time.NewTimer(writeRetry.Delay(attempt))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			a.healed()
			return false
		}
	}
}
