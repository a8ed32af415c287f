package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"transferconsumer/event"
	"transferconsumer/retry"
)

// Blocked is a queue whose message in hand keeps failing for a reason the
// environment caused, or may have: the worker retries it in place, and the
// queue takes nothing new until it passes (adr/0002). Readiness and metrics
// show it, so that a stopped line raises an alarm instead of emptying into
// the dead-letter queue.
type Blocked struct {
	Queue    string
	EventID  string
	TraceID  string      // the delivery's, when known
	Since    time.Time   // the first failed attempt
	Class    event.Class // ClassTransient, ClassUnknown or ClassPanic
	Reason   string      // the last error
	Attempts int
	// Err is the last error itself, for what the metrics name its cause
	// by (observe); Reason is its words.
	Err error
}

// ErrJournalStalled is in Blocked.Err of a queue whose acks wait because
// the journal's stream does not take its entries (JournalStalled).
var ErrJournalStalled = errors.New("the journal's stream does not take the queue's entries")

// blocked returns the queues blocked now, by name: by their message in
// hand, or else by the journal.
func (s *Service) blocked() []Blocked {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Blocked, 0, len(s.blockedQ)+len(s.journalQ))
	for _, b := range s.blockedQ {
		out = append(out, b)
	}
	for q, b := range s.journalQ {
		if _, ok := s.blockedQ[q]; !ok {
			out = append(out, b)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Queue < out[j].Queue })
	return out
}

func (s *Service) setBlocked(b Blocked) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.blockedQ[b.Queue] = b
}

func (s *Service) clearBlocked(queue string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.blockedQ, queue)
}

// JournalStalled reports queue blocked because the journal's stream did
// not take its entries (attempts tries since since; eventID is the first
// entry's event): its acks wait meanwhile (adr/0014). Readiness and the
// metrics show it as any queue the environment blocks, until
// JournalHealed.
func (s *Service) JournalStalled(queue string, since time.Time, attempts int, eventID string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.journalQ[queue] = Blocked{Queue: queue, EventID: eventID, Since: since, Class: event.ClassTransient,
		Reason: ErrJournalStalled.Error() + ", so its acks wait: " + err.Error(), Attempts: attempts,
		Err: fmt.Errorf("%w: %w", ErrJournalStalled, err)}
}

// JournalHealed: the journal's stream takes queue's entries again.
func (s *Service) JournalHealed(queue string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.journalQ, queue)
}

// logBlocked logs b's failed attempt when th says it is due: failures of
// the environment as warnings, unclassified ones as errors, since only a
// person can end those.
func logBlocked(log *slog.Logger, th *retry.Throttle, b Blocked, delay time.Duration) {
	due, changed := th.Due(b.Attempts, b.Reason)
	if !due {
		return
	}
	level, msg := slog.LevelWarn, "queue blocked: the environment failed, retrying the message in place"
	switch b.Class {
	case event.ClassUnknown:
		level, msg = slog.LevelError, "queue blocked: unclassified failure, retrying the message in place until it is fixed"
	case event.ClassPanic:
		level, msg = slog.LevelError, "queue blocked: handling the message panicked, retrying it in place"
	}
	if changed {
		msg = "queue still blocked, for another reason"
	}
	attrs := []any{"queue", b.Queue, "event_id", b.EventID, "class", string(b.Class),
		"attempts", b.Attempts, "blocked_ms", time.Since(b.Since).Milliseconds(),
		"next_retry_ms", delay.Milliseconds(), "err", b.Reason}
	if b.TraceID != "" {
		attrs = append(attrs, "trace_id", b.TraceID)
	}
	log.Log(context.Background(), level, msg, attrs...)
}

// reportBlocked reports the queue blocked on cmd.Blocked, retrying it in
// place after delay, for the reason cmd.Err, of the core's cmd.Class.
func (w *worker) reportBlocked(cmd command, delay time.Duration) {
	err, class := cmd.Err, cmd.Class
	if err == nil {
		err, class = errors.New("unknown"), event.ClassUnknown
	}
	b := &w.blocked
	if b.Attempts == 0 {
		b.Since = w.now()
		w.th = retry.Throttle{}
	}
	b.Queue, b.TraceID = w.queue, w.traceID
	if cmd.Blocked != nil {
		b.EventID = w.eventID(cmd.Blocked)
	}
	b.Attempts, b.Class, b.Reason, b.Err = cmd.Attempt+1, class, err.Error(), err
	w.svc.setBlocked(*b)
	logBlocked(w.svc.log, &w.th, *b, delay)
	if w.svc.cfg.ObserveRetry != nil {
		w.svc.cfg.ObserveRetry(Retry{Queue: w.queue, EventID: b.EventID, Attempt: cmd.Attempt + 1, Delay: delay, Err: err})
	}
}

// unblock clears the blocked report once the core retries no failure any
// more.
func (w *worker) unblock() {
	b := w.blocked
	if b.Attempts == 0 || w.core.retrying() {
		return
	}
	w.blocked = Blocked{}
	w.svc.clearBlocked(w.queue)
	w.svc.log.Info("queue unblocked", "queue", w.queue, "event_id", b.EventID, "attempts", b.Attempts,
		"blocked_ms", w.now().Sub(b.Since).Milliseconds())
}
