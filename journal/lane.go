package journal

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"transferconsumer/event"
)

// Lane is a worker's database lane with the journal: it gives the events
// it applies their queue's next sequences, moves the database's mark with
// them in their transaction, and journals those the worker will ack
// (applied, or duplicates) after the commit and before the ack, which
// waits for Journaled. Before
// its first attempt, and again whenever the database does not hold the
// mark it went on from (event.ErrJournalGap), it applies the queue's
// entries the database lacks, in the journal's order (Recover); while the
// queue is idle, the journal's watch does the same (Check). It implements
// the consumer's BatchLane.
type Lane struct {
	j       store
	queue   string
	inner   event.MarkedLane
	log     *slog.Logger
	reports Reports
	onClose func(prev int64, synced bool, kept int)

	// mu makes the worker's applies, the watch's checks and the restores
	// they run take turns: a restore is over before the next event is
	// applied, so each account's order holds.
	mu     sync.Mutex
	out    appender // the committed transactions' entries, on their way to the stream
	prev   int64    // the queue's last sequence, as the database holds it once synced
	synced bool
	// lastCheckMark is the database's mark as the last Check found it
	// while the lane was not synced (checkedUnsynced says one did): a
	// mark that moves past it meanwhile is moved by another reader, who
	// consumes the queue.
	lastCheckMark   int64
	checkedUnsynced bool
	closed          bool
	// unrestorable is the last Recover's *ShortError: while the database's mark
	// stays where it was, the retries of the waiting queue answer it again
	// without reading the stream from its start each time.
	unrestorable *ShortError
}

// store is where a Lane's entries go and come from: the Journal.
type store interface {
	write(ctx context.Context, queue string, msgs []event.Spilled) error
	readAll(ctx context.Context, since time.Time, reads map[string]*queueRead) error
}

// Wrap returns inner with the journal, for queue's worker. The journal's
// watch checks the lane until it is closed, the first time at once.
func (j *Journal) Wrap(queue string, inner event.MarkedLane, log *slog.Logger) *Lane {
	return j.wrap(j, queue, inner, log)
}

// wrap is Wrap, the lane's entries going to s.
func (j *Journal) wrap(s store, queue string, inner event.MarkedLane, log *slog.Logger) *Lane {
	l := makeLane(s, j.cfg, queue, inner, log)
	j.watch(l)
	return l
}

// makeLane returns a lane of queue over inner, its entries going to s,
// with cfg's spill and reports.
func makeLane(s store, cfg Config, queue string, inner event.MarkedLane, log *slog.Logger) *Lane {
	keepAfter := cfg.KeepAfter
	if keepAfter <= 0 {
		keepAfter = DefaultKeepAfter
	}
	return &Lane{j: s, queue: queue, inner: inner, log: log, reports: cfg.Reports,
		out: appender{j: s, spill: cfg.Spill, keepAfter: keepAfter, queue: queue, log: log, reports: cfg.Reports}}
}

// DefaultKeepAfter is how long a write waits for the stream's confirm
// before its entries are kept in the database instead, when nothing else
// is set: far above a confirm's usual few milliseconds, and far below the
// broker's consumer timeout (30 minutes by default, 15 seconds in some
// estates), which the held deliveries must not reach.
const DefaultKeepAfter = 3 * time.Second

// Journaled returns what is closed once the entries of every transaction
// the lane has committed so far are held: confirmed by the stream, or,
// while the stream does not take them, kept in the database (appender).
// Until then, the worker acks none of their events. Nil when all are
// held. It implements the consumer's journaledLane.
func (l *Lane) Journaled() <-chan struct{} { return l.out.journaled() }

// Apply applies ev, as the inner lane would, and journals it.
func (l *Lane) Apply(ctx context.Context, ev event.Event) (event.Result, error) {
	outs, err := l.ApplyBatch(ctx, []event.Event{ev})
	if err != nil {
		return event.Result{}, err
	}
	return outs[0].Result, outs[0].Err
}

// ApplyBatch applies evs in one transaction, as the inner lane would,
// and journals them: those the worker will ack, and, as entries that are
// never applied again, those dead-lettered in that transaction (producer
// conflicts). It returns once the transaction committed, with the entries
// on their way to the stream (appender): the worker acks them once
// Journaled says they are held (confirmed by the stream, or kept in the
// database), and applies its next events meanwhile. An error means
// nothing was committed. A database that came back without commits it had
// (a failover, a restore) is found by the first transaction on it, which
// fails with event.ErrJournalGap: the lane then reads the journal again
// and applies what is missing first.
func (l *Lane) ApplyBatch(ctx context.Context, evs []event.Event) ([]event.Outcome, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var outs []event.Outcome
	err := l.commitNext(ctx, len(evs), func(m event.Mark) (entries []Entry, err error) {
		if outs, err = l.inner.ApplyMarked(ctx, evs, m); err != nil {
			return nil, err
		}
		entries = make([]Entry, len(evs))
		for i, o := range outs {
			entries[i] = Entry{Queue: l.queue, Seq: m.Prev + 1 + int64(i), Event: evs[i], Dead: o.Err != nil}
		}
		return entries, nil
	})
	if err != nil {
		return nil, err
	}
	return outs, nil
}

// MarkedParker is a database lane that can park a dead letter and move
// the journal's mark in one transaction (db's ParkMarked): a worker's
// letter during a broker alarm (Park) takes its entry's sequence so, and
// a restore writes every letter so, with the move of the mark past its
// entry.
type MarkedParker interface {
	ParkMarked(ctx context.Context, l event.OutboxLetter, m event.Mark) error
}

// Park parks lt, the dead letter of a message the worker is about to ack
// (a broker alarm holds its copy back), in the database's outbox, and
// journals it: the letter takes the queue's next sequence, in the same
// transaction, and its entry is on its way to the stream when Park
// returns; the worker's ack waits for Journaled, as for an applied event.
// A failover or a restore that takes the commit back thus takes the
// letter out of the outbox, and the restore parks it again. It returns the
// database's errors; a gap is restored first, as ApplyBatch does.
func (l *Lane) Park(ctx context.Context, lt event.OutboxLetter) error {
	mp, ok := l.inner.(MarkedParker)
	if !ok {
		return errors.New("journal: the database's lane cannot park a letter with the journal's mark")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.commitNext(ctx, 1, func(m event.Mark) ([]Entry, error) {
		if err := mp.ParkMarked(ctx, lt, m); err != nil {
			return nil, err
		}
		kept := lt
		kept.Abandoned, kept.Queue = nil, l.queue
		return []Entry{{Queue: l.queue, Seq: m.Last, Dead: true, Letter: &kept,
			Event: event.Event{ID: lt.EventID, Type: lt.EventType}}}, nil
	})
}

// commitNext commits a transaction that takes the queue's next n
// sequences: commit runs it, moving the database's mark as m says, and
// returns the entries it journals, which go to the writer once it
// committed. The lane restores first when it is not synced, and again
// when the database does not hold the mark it went on from
// (event.ErrJournalGap: a failover, a restore, another reader), then
// commits once more; a second gap is returned. An error means nothing
// was committed. Under mu.
func (l *Lane) commitNext(ctx context.Context, n int, commit func(m event.Mark) ([]Entry, error)) error {
	for again := true; ; again = false {
		if !l.synced {
			if _, err := l.recoverAgain(ctx); err != nil {
				return event.Transient(&restoreError{err})
			}
		}
		m := event.Mark{Queue: l.queue, Prev: l.prev, Last: l.prev + int64(n)}
		entries, err := l.commitTold(m, commit)
		if errors.Is(err, event.ErrJournalGap) {
			l.synced = false
			l.log.Warn("journal: the database does not hold the mark the worker went on from, or does not vouch for it "+
				"since a restart, a failover or a restore; reading the journal again",
				"queue", l.queue, "err", err)
			if again {
				continue
			}
		}
		if err != nil {
			return err
		}
		l.prev = m.Last
		l.out.add(entries)
		return nil
	}
}

// commitTold is commit(m), the writer told of it while it goes on
// (appender.committing): after a loss of commits, its move from below
// entries the writer kept says they are lost.
func (l *Lane) commitTold(m event.Mark, commit func(m event.Mark) ([]Entry, error)) (entries []Entry, err error) {
	l.out.committing(m.Prev)
	defer func() { l.out.committed(m.Prev, err == nil) }()
	return commit(m)
}

// Check compares the database's mark with the lane's, as the journal's
// watch does for every lane while its worker waits for events, so that
// what a database lost (a failover, a restore) is applied again without
// waiting for the queue's next event. It restores (Recover) when the
// database holds less than the lane went on from, when the lane is not
// synced (a restore that failed, or a lane not used yet) and the mark
// stands still, and when the database does not vouch for the mark (a
// restart, a failover or a restore since: what another replica applied
// after this lane last looked may be gone with it, the mark back where
// this lane left it). A mark that moves past the lane's is moved by another
// reader (a replica consuming the queue, the recover command): the lane
// is then no longer synced, and reads the journal before it applies
// again, in case the database loses what the other reader had moved.
//
// A lane whose worker is applying, or whose entries are on their way, is
// passed over: its next transaction checks the mark itself, and the
// worker never waits for the watch to read it.
func (l *Lane) Check(ctx context.Context) (int, error) {
	if !l.mu.TryLock() {
		return 0, nil
	}
	defer l.mu.Unlock()
	if l.closed || l.out.busy() {
		return 0, nil
	}
	began := time.Now()
	read, cancel := context.WithTimeout(ctx, markReadFor)
	mark, here, err := l.markHere(read)
	cancel()
	if err != nil {
		return 0, err
	}
	switch {
	case l.synced && mark == l.prev && here:
		l.vouchIdle(ctx, mark, began)
		return 0, nil
	case l.synced && mark > l.prev, !l.synced && l.checkedUnsynced && mark > l.lastCheckMark:
		l.synced, l.lastCheckMark, l.checkedUnsynced = false, mark, true
		return 0, nil
	}
	n, err := l.recoverAgain(ctx)
	if err != nil {
		l.lastCheckMark, l.checkedUnsynced = mark, true
	} else {
		l.out.settle(l.prev) // where the database and the journal reach together
	}
	return n, err
}

// vouchIdle raises the mark's time of a queue found synced and vouched
// for to when its check began (Vouch): the journal holds no entry of the
// queue above the mark written before then, since such an entry follows a
// commit that moved the mark past it in this run of the server, which
// would show. So the next read of an idle queue, a start's,
// reaches back to its last check, not to when it last moved or was last
// read, weeks back perhaps in a service that runs for weeks. A write that
// fails is only logged: the next check tries again, and a read from
// further back costs time, not entries.
//
// The lane synced at the database's mark, vouched for since the last
// loss, also has its writer settle the entries it kept that went with
// their commits (appender.settle): the mark is where the database and
// the journal reach together.
func (l *Lane) vouchIdle(ctx context.Context, mark int64, began time.Time) {
	l.out.settle(mark)
	v, ok := l.inner.(Voucher)
	if !ok {
		return
	}
	vouch, cancel := context.WithTimeout(ctx, markReadFor)
	defer cancel()
	if err := v.Vouch(vouch, l.queue, mark, began); err != nil && ctx.Err() == nil {
		l.log.Debug("journal: could not raise an idle queue's mark time", "queue", l.queue, "err", err)
	}
}

// markHere returns the database's mark, and whether the database vouches
// that it lost no commit of the queue since a read of the journal last
// synced it (Voucher); a lane over a database that cannot say takes its
// mark as vouched for.
func (l *Lane) markHere(ctx context.Context) (int64, bool, error) {
	if v, ok := l.inner.(Voucher); ok {
		mark, why, err := v.Vouched(ctx, l.queue)
		return mark, why == "", err
	}
	mark, _, err := l.inner.Marked(ctx, l.queue)
	return mark, true, err
}

// markReadFor bounds a check's read of the mark, so that a database that
// does not answer (a partition) keeps an idle queue's worker waiting on the
// check no longer than this when its next event comes.
const markReadFor = 10 * time.Second

// Renew replaces the inner lane, closing the old one (after a panic,
// which may have left it inside a transaction), and keeps what the lane
// knows of the mark: if the panic came after a commit, the next
// transaction finds the mark moved (event.ErrJournalGap) and syncs.
func (l *Lane) Renew(inner event.Lane) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inner.Close()
	l.inner = inner.(event.MarkedLane)
}

// Mark is the queue's last sequence the lane knows the database holds.
func (l *Lane) Mark() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.prev
}

// Close closes the inner lane; the journal's watch forgets the lane, and
// keeps its mark for the queue's next lane. Entries it kept in the
// database and did not write to the stream are no longer counted by it
// (Reports.Unprotected): the queue's next lane counts them again when
// its writer looks, which it does at once.
func (l *Lane) Close() {
	l.out.close()
	l.out.undecided()
	kept := l.out.keptCount()
	if kept > 0 && l.reports.Unprotected != nil {
		l.reports.Unprotected(l.queue, -kept)
	}
	l.mu.Lock()
	l.closed = true
	l.inner.Close()
	prev, synced := l.prev, l.synced
	l.mu.Unlock()
	if l.onClose != nil {
		l.onClose(prev, synced, kept)
	}
}
