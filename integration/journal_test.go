package integration

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
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
