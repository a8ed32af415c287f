package journal

import (
	"context"
	"log/slog"
	"time"
)

// CheckEvery is how often the watch checks every lane when nothing kicks
// it: a database reached through a pooler that reconnects on its own (a
// failover behind PgBouncer) shows no new connection to the service.
const CheckEvery = 30 * time.Second

// checkFor bounds the start's restore of every queue (RestoreAtStart), and
// watchFor one lane's check by the watch, its restore included: the lane
// is held meanwhile, and its worker's next event waits for it, so a
// stream that does not answer holds it only so long. A restore cut short
// keeps what it applied, and the next check or the queue's next event
// goes on from there.
const (
	checkFor = 2 * time.Minute
	watchFor = 10 * time.Second
)

// watch adds l to the lanes the watch checks, kicks the watch, and has
// l's Close take it out.
//
// A lane of a queue whose last lane this process closed synced (the
// session before a broker reconnect) goes on from that lane's mark, as the
// same lane would have: its first transaction, or the watch's first check,
// finds whether the database still holds it, without reading the stream.
// One whose last lane closed with entries kept in the database has its
// writer take them to the stream at once, whether or not the queue has
// events: before, an idle queue's kept entries waited for its next event
// after a reconnect, and were counted twice meanwhile.
func (j *Journal) watch(l *Lane) {
	j.lanesMu.Lock()
	if j.lanes == nil {
		j.lanes, j.lastMarks, j.lastKept = map[*Lane]struct{}{}, map[string]int64{}, map[string]bool{}
	}
	j.lanes[l] = struct{}{}
	if prev, ok := j.lastMarks[l.queue]; ok {
		l.prev, l.synced = prev, true
	}
	if j.lastKept[l.queue] {
		l.out.drainKept()
	}
	j.lanesMu.Unlock()
	l.onClose = func(prev int64, synced bool, kept int) {
		j.lanesMu.Lock()
		defer j.lanesMu.Unlock()
		delete(j.lanes, l)
		if synced {
			j.lastMarks[l.queue] = prev
		} else {
			delete(j.lastMarks, l.queue)
		}
		j.lastKept[l.queue] = kept != 0
	}
	j.CheckNow()
}

// CheckNow has the watch check every lane now: the service kicks it at each
// new database connection, so after every reconnect (a failover, a
// restore), and each new lane does.
func (j *Journal) CheckNow() {
	select {
	case j.kicked() <- struct{}{}:
	default:
	}
}

func (j *Journal) kicked() chan struct{} {
	j.kickOnce.Do(func() { j.kick = make(chan struct{}, 1) })
	return j.kick
}

// Watch checks every lane (Lane.Check) when kicked and every every, until
// ctx ends: a queue without traffic whose database lost what it had
// applied (a failover to a standby that was behind, a point-in-time
// restore) is restored from the journal without waiting for its next
// event. Its failures are logged; the lanes' own applies retry them.
func (j *Journal) Watch(ctx context.Context, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-j.kicked():
		}
		j.checkAll(ctx, log)
	}
}

// checkAll checks every lane once, each for watchFor at most.
func (j *Journal) checkAll(ctx context.Context, log *slog.Logger) {
	j.lanesMu.Lock()
	lanes := make([]*Lane, 0, len(j.lanes))
	for l := range j.lanes {
		lanes = append(lanes, l)
	}
	j.lanesMu.Unlock()
	for _, l := range lanes {
		check, cancel := context.WithTimeout(ctx, watchFor)
		_, err := l.Check(check)
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Warn("journal: could not compare the queue's journal with the database; its next event, or the next check, tries again",
				"queue", l.queue, "err", err)
		}
	}
}
