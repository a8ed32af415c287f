package journal

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Voucher is a database lane that records, once a read of the journal
// synced a queue, that the database holds every entry of it up to its
// mark (Vouch), and says later whether the database can have lost a
// commit of the queue since (Vouched: "" when it cannot). What it trusts
// is db's, one definition in SQL (journal_mark_doubt, adr/0014 "What is
// trusted"): the mark's row written, in this run of the server, by that
// read or by a transaction that moved the mark on from a trusted one, and
// by the very transaction it names. No restore brings that back: each
// starts the server again or writes the row anew. Vouch also raises the
// mark's time to when that read began (began, on the service's clock),
// unless the mark moved later: the journal held no entry of the queue
// above the mark before then, so the next read of it may start there, and
// an idle queue's start reads back only to the last read that synced it,
// not to when its mark last moved.
//
// The database's transactions that move the mark require the same trust
// (journal_advance), and the watch asks it of a lane it holds synced
// (Check), so that a failover or a restore that took back what another
// replica applied after this lane last looked is found before this lane
// takes those sequences again.
type Voucher interface {
	Vouch(ctx context.Context, queue string, mark int64, began time.Time) error
	Vouched(ctx context.Context, queue string) (mark int64, why string, err error)
}

// ErrUnvouched is in the error of a restore whose read of the journal
// could not begin (an event.ErrJournalUnread too) when the database does
// not vouch that it lost no commit of the queue since a read last synced
// it (goOnVouched): it restarted, failed over or was restored since, or
// could not be asked, or another reader moved the mark meanwhile. Only
// the read lets the queue go on then. The service names a queue held so
// apart from one whose read alone failed (observe).
var ErrUnvouched = errors.New("the database does not vouch for the queue's journal mark")

// goOnVouched ends a restore whose read of the journal could not begin
// (err, an *unreadError: a broker alarm holds its fence, the stream does
// not answer): the lane goes on from the database's mark, synced, when
// the database vouches that it has lost no commit of the queue since a
// read last synced it; the journal then holds no entry of the queue
// above the mark, so there is nothing to read. That is what lets a queue
// start, or come back after a reconnect, during an alarm, as it does
// without the journal. It returns nil then, and otherwise err, with why
// the lane cannot go on without the read (ErrUnvouched, when the
// database was asked).
func (r *restoring) goOnVouched(err error) error {
	l := r.l
	var unread *unreadError
	v, ok := l.inner.(Voucher)
	if !errors.As(err, &unread) || !ok || r.started || r.held != r.mark {
		return err
	}
	mark, why, verr := v.Vouched(r.ctx, l.queue)
	switch {
	case verr != nil:
		return &unvouchedError{fmt.Errorf("%w; and whether the database holds every entry of the queue cannot be read: %v", err, verr)}
	case why != "":
		return &unvouchedError{fmt.Errorf("%w; and the database cannot vouch that it holds every entry of the queue (%s), so the queue waits for the journal", err, why)}
	case mark != r.mark:
		return &unvouchedError{fmt.Errorf("%w; and the mark moved meanwhile (another reader of the queue), so the queue waits for the journal", err)}
	}
	l.prev, l.synced, l.checkedUnsynced = mark, true, false
	l.log.Warn("journal: the journal cannot be read now, but the database has lost no commit of the queue since a read of the journal "+
		"last synced it (the same run of the server, the mark's row as that read or a move from it wrote it), so the queue goes on "+
		"from its mark without reading it",
		"queue", l.queue, "mark", mark, "why_unread", err)
	return nil
}

// unvouchedError is goOnVouched's refusal: it reads as its words, and is
// an ErrUnvouched besides what it wraps.
type unvouchedError struct{ err error }

func (e *unvouchedError) Error() string        { return e.err.Error() }
func (e *unvouchedError) Unwrap() error        { return e.err }
func (e *unvouchedError) Is(target error) bool { return target == ErrUnvouched }
