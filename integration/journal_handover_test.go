package integration

import (
	"errors"
	"testing"
	"time"

	"transferconsumer/db"
	"transferconsumer/event"
)

// A real failover, as a replica that held its lane synced would meet it
// (adr/0014, "A handover across a failover"). A read vouches for the
// queue's mark at 3 on the primary, and the standby replays it; the
// standby is then held behind while another replica moves the mark to 6,
// and the primary crashes. The promoted standby holds the mark at 3, the
// very one the first replica went on from, but in another run of a
// server: it vouches for nothing there, so the first replica's next transaction
// fails with ErrJournalGap and applies nothing (its lane then reads the
// journal, which holds 4 to 6), and once a read vouched for the mark on
// the new primary, the transaction goes through. On the former code the
// move from 3 went through at once, and the sequences 4 to 6, journaled
// for acked events, were taken again. (Named TestFailoverTo… so that the
// 4.x passes leave it to the 3.10 pass, as the other database failovers:
// it needs no broker.)
func TestFailoverToAStandbyBehindMovesNoMarkUntilAReadVouchedForIt(t *testing.T) {
	parallel(t)
	primary, standby, admin, replication := asyncPair(t)
	e := newEnvOn(t, primary.adminURL())
	queue := e.name + ".0"
	laneOf := func() vouchedLane {
		l := db.NewInbox(e.db).Lane(0).(vouchedLane)
		t.Cleanup(l.Close)
		return l
	}
	move := func(l vouchedLane, prev, last int64) error {
		_, err := l.ApplyMarked(t.Context(), nil, event.Mark{Queue: queue, Prev: prev, Last: last})
		return err
	}

	l := laneOf()
	if err := l.Vouch(t.Context(), queue, 0, time.Now()); err != nil { // the first read found no entry of the queue
		t.Fatal(err)
	}
	if err := move(l, 0, 3); err != nil {
		t.Fatal(err)
	}
	caughtUp(t, admin, standby)
	replication.down()                    // the standby falls behind from here
	if err := move(l, 3, 6); err != nil { // the other replica's transactions, journaled and acked
		t.Fatal(err)
	}
	promote(primary, standby)
	e.useAddr(standby.addr())

	l = laneOf()
	if mark, why, err := l.Vouched(t.Context(), queue); err != nil || mark != 3 || why == "" {
		t.Fatalf("on the promoted standby: mark %d, %q (%v); want 3, and why it cannot vouch", mark, why, err)
	} else {
		t.Logf("why the promoted standby cannot vouch for the mark: %s", why)
	}
	if err := move(l, 3, 4); !errors.Is(err, event.ErrJournalGap) {
		t.Fatalf("a move from the mark the failover came back to: %v; want ErrJournalGap, so that the lane reads the journal first", err)
	}
	if m, _, err := l.Marked(t.Context(), queue); err != nil || m != 3 {
		t.Fatalf("the refused move moved the mark to %d (%v)", m, err)
	}
	// The read restores 4 to 6 (a restore's moves need no vouch) and
	// vouches on the new primary; the lane's transactions go on from there.
	if _, err := l.ApplyMarked(t.Context(), nil, event.Mark{Queue: queue, Prev: 3, Last: 6, Restore: true}); err != nil {
		t.Fatal(err)
	}
	if err := l.Vouch(t.Context(), queue, 6, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := move(l, 6, 7); err != nil {
		t.Fatalf("after a read vouched for the mark on the new primary: %v", err)
	}
}
