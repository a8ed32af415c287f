package integration

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"
)

// With the journal on (JOURNAL_STREAM), the loss
// TestFailoverToAnAsynchronousStandbyLosesAckedEvents shows does not
// happen: the standby is held behind while the service applies and acks
// events, the primary crashes and the standby is promoted. The service's
// next transaction on each queue finds the database without the journal
// mark it went on from, reads the queue's entries the database lacks from
// the journal, applies them again in order, and goes on: every event is
// applied exactly once, balances are right, each account's events are
// applied in their order, nothing is dead-lettered, at BATCH_MAX 1 and 50.
func TestFailoverToAnAsynchronousStandbyWithTheJournalLosesNothing(t *testing.T) {
	parallel(t)
	for _, batch := range []int{1, 50} {
		t.Run(fmt.Sprintf("BATCH_MAX %d", batch), func(t *testing.T) {
			t.Parallel() // each on servers of its own
			primary := newPGCluster(t)
			admin := sqlx.MustOpen("postgres", primary.adminURL())
			t.Cleanup(func() { admin.Close() })
			replication := newProxy(t, primary.addr())
			standby := standbyOf(primary, "standby1", replication.addr)
			streaming(t, admin, "standby1", "async")
			e := newEnvOn(t, primary.adminURL())
			e.declare(2)
			e.recordApplyOrder()

			proc := startProcess(t, e.serviceEnv(2, "DATABASE_URL="+failoverURL(false, e.name, primary, standby),
				fmt.Sprintf("BATCH_MAX=%d", batch), "APPLY_TIMEOUT=5s", "JOURNAL_STREAM="+prefix+".journal"))
			proc.waitConsuming(1)

			before := e.publishMany(100, 8)
			waitFor(t, 60*time.Second, "the first events applied", func() bool { return e.inboxCount() == len(before) })
			var lsn string
			admin.Get(&lsn, `SELECT pg_current_wal_lsn()::text`)
			standbyAdmin := sqlx.MustOpen("postgres", standby.adminURL())
			t.Cleanup(func() { standbyAdmin.Close() })
			waitFor(t, 60*time.Second, "the standby caught up with them", func() bool {
				var caught bool
				standbyAdmin.Get(&caught, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, lsn)
				return caught
			})

			replication.down() // the standby falls behind from here
			after := transfers(e, 300, 8)
			for _, tr := range after {
				e.publish(tr)
			}
			waitFor(t, 60*time.Second, "the later events applied and acked", func() bool {
				return e.inboxCount() == len(before)+len(after) && e.ready(prefix+".0")+e.ready(prefix+".1") == 0 &&
					proc.count("outcome", "applied") == len(before)+len(after)
			})
			promote(primary, standby)
			e.useAddr(standby.addr())
			lost := 0
			for _, ev := range after {
				if e.inboxRows(ev.EventID) == 0 {
					lost++
				}
			}
			t.Logf("the new primary lacks %d of the %d events acked while the standby was behind", lost, len(after))
			if lost == 0 {
				t.Fatalf("no acked event is missing on the new primary: the test held nothing back")
			}

			more := transfers(e, 100, 8)
			for _, tr := range more {
				e.publish(tr)
			}
			events := append(append(before, after...), more...)
			waitFor(t, 120*time.Second, "every event applied on the new primary", func() bool { return e.inboxCount() == len(events) })
			if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
				t.Errorf("exit after SIGTERM: %v", err)
			}
			e.checkExactlyOnce(events)
			e.checkAccountOrder(events)
			if n := proc.count("outcome", "dead_lettered"); n != 0 {
				t.Errorf("%d events dead-lettered", n)
			}
			// Each lost event was applied again from the journal (the
			// count may include entries the standby held, which the
			// inbox dropped).
			if restored := proc.sum("journal: applied again the entries the database had lost", "entries"); restored < lost {
				t.Errorf("the service says it applied %d entries again, want at least the %d lost", restored, lost)
			}
		})
	}
}

// A gap the journal no longer reaches back to is reported, with how many
// events at most are lost and since when, and its queue waits: the event
// in hand is not applied until an operator accepts the loss with recover
// --accept-loss; then the rest is restored (the inbox drops what survived)
// and the queue goes on. The journal's retention is real: a stream that
// keeps about 20 KB in segments of 4 KB has dropped the first entries; the
// database's loss is made by moving its mark back, as a restore to an
// earlier time would have left it.
func TestAGapOlderThanTheJournalIsReportedAndItsQueueWaits(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(1)
	stream := prefix + ".journal"
	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(stream, true, false, false, false, amqp.Table{"x-queue-type": "stream",
		"x-max-length-bytes": int64(20000), "x-stream-max-segment-size-bytes": int64(4000)}); err != nil {
		t.Fatal(err)
	}
	env := e.serviceEnv(1, "DECLARE_TOPOLOGY=false", "JOURNAL_STREAM="+stream)
	proc := startProcess(t, env)
	proc.waitConsuming(1)
	events := e.publishMany(200, 4)
	waitFor(t, 60*time.Second, "the events applied and acked", func() bool {
		return e.inboxCount() == len(events) && proc.count("outcome", "applied") == len(events)
	})
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	e.db.MustExec(`UPDATE journal_mark SET seq = 50, at = now() - interval '1 hour' WHERE queue = $1`, prefix+".0")

	proc = startProcess(t, env)
	const short = "cannot be restored whole"
	waitFor(t, 60*time.Second, "the service to say the journal does not reach back", func() bool {
		return strings.Contains(proc.field("journal: the queue's entries could not be compared with the database before consuming; "+
			"its first event waits until they are", "err"), short)
	})
	held := e.publishMany(1, 4)
	waitFor(t, 60*time.Second, "the queue blocked on the event in hand, for that reason", func() bool {
		return strings.Contains(proc.field("queue blocked: the environment failed, retrying the message in place", "err"), short)
	})
	if n := e.inboxRows(held[0].EventID); n != 0 {
		t.Fatalf("the event in hand was applied while the queue waited")
	}
	out, err := runCommand(t, env, "recover")
	if err == nil || !strings.Contains(out, short) || !strings.Contains(out, "up to ") || !strings.Contains(out, "--accept-loss") {
		t.Fatalf("recover: %v\n%s\nwant exit 1 and the queue's loss named", err, out)
	}
	t.Logf("recover says: %s", out)
	out, err = runCommand(t, env, "recover", "--accept-loss")
	if err != nil || !strings.Contains(out, "accepted the loss of up to ") {
		t.Fatalf("recover --accept-loss: %v\n%s", err, out)
	}
	waitFor(t, 60*time.Second, "the event in hand applied once the loss was accepted", func() bool {
		return e.inboxRows(held[0].EventID) == 1
	})
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	e.checkExactlyOnce(append(events, held...))
}
