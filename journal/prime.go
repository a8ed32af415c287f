package journal

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"transferconsumer/event"
)

// RestoreAtStart restores every queue of queues at once, in one pass over the
// stream (RecoverAll), before the service consumes them, each on a lane
// from newLane, and closes those lanes: the workers' lanes then go on
// from the marks they were left synced at, without each reading the same
// stretch of the stream. A queue it could not restore (the journal down,
// a journal that does not reach back) is logged, and its worker's lane
// restores it itself before its first event. It takes at most checkFor.
func (j *Journal) RestoreAtStart(ctx context.Context, queues []string, newLane func() event.MarkedLane, log *slog.Logger) {
	j.restoreAtStart(ctx, j, queues, newLane, log)
}

// restoreAtStart is RestoreAtStart, reading s.
func (j *Journal) restoreAtStart(ctx context.Context, s store, queues []string, newLane func() event.MarkedLane, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, checkFor)
	defer cancel()
	lanes := make([]*Lane, len(queues))
	for i, q := range queues {
		lanes[i] = j.wrap(s, q, newLane(), log)
		defer lanes[i].Close()
	}
	start := time.Now()
	applied, errs := recoverAll(ctx, s, lanes)
	total := 0
	for _, q := range queues {
		total += applied[q]
		if err := errs[q]; err != nil {
			log.Warn("journal: could not compare the queue's journal with the database at start; its first event waits until it is",
				"queue", q, "err", err)
		}
	}
	log.Info("journal: compared every queue with the database in one read of the stream", "queues", len(queues),
		"entries_applied_again", total, "failed", len(errs), "took_ms", time.Since(start).Milliseconds())
}

// RecoverAll is Recover of every lane at once, in one pass over the
// stream (two when some queue's read has to start from the stream's
// start), instead of one pass per queue over the same stretch. It returns
// each queue's count of entries applied again, and the errors by queue.
func (j *Journal) RecoverAll(ctx context.Context, lanes []*Lane) (map[string]int, map[string]error) {
	return recoverAll(ctx, j, lanes)
}

func recoverAll(ctx context.Context, s store, lanes []*Lane) (map[string]int, map[string]error) {
	applied, errs := map[string]int{}, map[string]error{}
	rs := map[string]*restoring{}
	var since time.Time
	for _, l := range lanes {
		l.mu.Lock()
		defer l.mu.Unlock()
		if _, dup := rs[l.queue]; dup || l.closed {
			continue
		}
		r, err := l.startRestore(ctx)
		if r == nil {
			errs[l.queue] = err
			continue
		}
		if len(rs) == 0 || r.at.Before(since) {
			since = r.at // zero, a queue without a mark: from the stream's start
		}
		rs[l.queue] = r
	}
	pass := func(since time.Time, which map[string]*restoring) map[string]*queueRead {
		reads := map[string]*queueRead{}
		for q, r := range which {
			reads[q] = &queueRead{after: r.mark, page: r.page}
		}
		if len(reads) == 0 {
			return reads
		}
		if err := s.readAll(ctx, since, reads); err != nil {
			for _, qr := range reads {
				qr.err = err
			}
		}
		return reads
	}
	end := func(q string, r *restoring, qr *queueRead) {
		n, err := r.end(qr.found, qr.err)
		if errors.Is(err, event.ErrJournalGap) {
			// Another reader moved the mark under it: this queue alone,
			// from the mark the database holds now.
			var m int
			m, err = r.l.recoverAgain(ctx)
			n += m
		}
		applied[q] = n
		if err != nil {
			errs[q] = err
		}
	}
	reads := pass(since, rs)
	again := map[string]*restoring{}
	for q, r := range rs {
		if errors.Is(reads[q].err, errFromStart) {
			again[q] = r
			continue
		}
		end(q, r, reads[q])
	}
	if len(again) > 0 {
		reads = pass(time.Time{}, again)
		for q, r := range again {
			end(q, r, reads[q])
		}
	}
	return applied, errs
}
