package integration

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/db"
	"transferconsumer/event"
	"transferconsumer/journal"
)

// journal.Readable, which the service probes before it consumes again
// after a queue waited for a read of the journal that could not begin,
// against the running broker: it passes while a read can begin, fails as
// event.ErrJournalUnread once a memory alarm blocks the journal's
// publishing connection (a connection's first publish in an alarm still
// goes through; the next is held, and with it the read's fence), and
// passes again once the alarm clears, without a new connection.
func TestTheJournalIsReadableOnlyWhileAReadCanBegin(t *testing.T) {
	e := newEnv(t)
	ctl := rabbitmqctl(t)
	j := journal.New(journal.Config{Stream: prefix + ".journal", MaxAge: "1h", Declare: true,
		Dial: func() (*amqp.Connection, error) { return amqp.Dial(e.amqpURL) }})
	defer j.Close()
	readable := func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		return j.Readable(ctx)
	}
	if err := readable(); err != nil {
		t.Fatalf("before the alarm: %v", err)
	}
	clear := setMemoryAlarm(t, ctl)
	var during error
	waitFor(t, 60*time.Second, "the journal unreadable during the alarm", func() bool {
		during = readable()
		return during != nil
	})
	if !errors.Is(during, event.ErrJournalUnread) {
		t.Errorf("during the alarm: %v, want an event.ErrJournalUnread", during)
	}
	clear()
	waitFor(t, 60*time.Second, "the journal readable once the alarm cleared", func() bool { return readable() == nil })
	t.Logf("during the alarm: %v", during)
}

// A replica started during an alarm, whose journal connection the broker
// blocks already (so its fence is held: the read cannot begin), goes on
// from the marks the database vouches for, on the running broker and
// database. The queue was marked only after the first replica's one read,
// which found no entry of it: that read made the queue's row at 0,
// vouched for, and the first transaction moved it on. Before, such a
// row was never vouched for until a later read, and the queue waited, its
// event in hand, for the whole alarm.
func TestAStartDuringAnAlarmGoesOnFromTheMarkItsFirstReadVouchedFor(t *testing.T) {
	e := newEnv(t)
	ctl := rabbitmqctl(t)
	database, err := db.Open(t.Context(), e.dbURL, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer database.Close()
	inbox := db.NewInbox(database)
	newLane := func() event.MarkedLane { return inbox.Lane(10 * time.Second).(event.MarkedLane) }
	cfg := journal.Config{Stream: prefix + ".journal", MaxAge: "1h", Declare: true,
		Dial: func() (*amqp.Connection, error) { return amqp.Dial(e.amqpURL) }}
	log := slog.New(slog.DiscardHandler)
	queue := prefix + ".0"
	apply := func(l *journal.Lane, n int) error {
		evs := make([]event.Event, n)
		for i := range evs {
			var err error
			if evs[i], err = event.Decode(newTransfer("acc_v_"+e.name, "acc_w_"+e.name, 1).body(), "", ""); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		_, err := l.ApplyBatch(ctx, evs)
		return err
	}

	began := time.Now()
	stage := func(what string) { t.Logf("%5.1f s: %s", time.Since(began).Seconds(), what) }
	first := journal.New(cfg)
	first.RestoreAtStart(t.Context(), []string{queue}, newLane, log)
	stage("the first replica compared the queue with the journal")
	l := first.Wrap(queue, newLane(), log)
	if err := apply(l, 3); err != nil {
		t.Fatalf("the first replica, before any alarm: %v; want its events applied", err)
	}
	// Journaled is nil once every entry is confirmed: the confirm may
	// have come before it is asked.
	if c := l.Journaled(); c != nil {
		select {
		case <-c:
		case <-time.After(30 * time.Second):
			t.Fatal("the first events' entries were not confirmed in 30 s, before any alarm; want them confirmed")
		}
	}
	stage("its entries confirmed")
	l.Close()
	first.Close()

	clear := setMemoryAlarm(t, ctl)
	second := journal.New(cfg)
	defer second.Close()
	defer clear() // before the Close above, should the test end early
	waitFor(t, 60*time.Second, "the second replica's journal connection blocked by the alarm", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		return errors.Is(second.Readable(ctx), event.ErrJournalUnread)
	})
	stage("the alarm raised, the second replica's journal unreadable")
	second.RestoreAtStart(t.Context(), []string{queue}, newLane, log)
	stage("the second replica went on from the vouched mark, or gave up")
	l2 := second.Wrap(queue, newLane(), log)
	if err := apply(l2, 2); err != nil {
		l2.Close()
		t.Fatalf("a replica started during the alarm, its journal unreadable: %v; want it to go on from the vouched mark", err)
	}
	var mark int64
	if err := e.db.Get(&mark, `SELECT seq FROM journal_mark WHERE queue = $1`, queue); err != nil || mark != 5 {
		t.Errorf("the mark is %d (%v), want 5", mark, err)
	}
	// A shutdown during the alarm: the broker reads nothing more from the
	// blocked connection, not even its close, which must not wait for it.
	closed := make(chan struct{})
	go func() {
		l2.Close()
		second.Close()
		close(closed)
	}()
	select {
	case <-closed:
		stage("closed during the alarm")
	case <-time.After(20 * time.Second):
		t.Error("closing the journal during the alarm did not return in 20 s; want it to return: a shutdown during an alarm would hang")
	}
}
