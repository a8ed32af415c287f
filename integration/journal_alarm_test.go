package integration

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"transferconsumer/dlq"
)

// A broker alarm with the journal on, raised with a backlog queued: the
// journal's publishes are held by the alarm, so its entries are kept in
// the database and the events acked, and the backlog drains while the
// alarm lasts, as it does without the journal (TestAlarmHoldsNoQueueBehindAPoison).
// Meanwhile the acked events whose entries are only in the database are
// counted in transferconsumer_journal_unprotected_events; once the alarm
// clears, every entry reaches the stream, the count is back at 0, every
// event is applied once and is in the journal, and each poison's letter
// reaches the DLQ, each poison's parked letter being in the journal too.
//
// "started during it": the service is stopped, the backlog queued, the
// alarm raised, and a new process started. Its read of the journal
// cannot begin (the alarm holds the read's fence), and the database
// vouches that it lost no commit since the last read synced each queue,
// so every queue goes on from its mark and the backlog drains.
func TestAnAlarmWithTheJournalDoesNotStopTheBacklog(t *testing.T) {
	for _, alarm := range []struct {
		name, kind string
		set        func(*testing.T, brokerCtl) func()
		restart    bool
	}{
		{"memory", "memory", setMemoryAlarm, false},
		{"disk", "disk", setDiskAlarm, false},
		{"memory, the service started during it", "memory", setMemoryAlarm, true},
	} {
		t.Run(alarm.name, func(t *testing.T) {
			e := newEnv(t)
			ctl := rabbitmqctl(t)
			e.declare(2)
			stream := prefix + ".journal"
			env := e.serviceEnv(2, "INSTANCE_NAME="+e.name+"-svc", "JOURNAL_STREAM="+stream)
			proc := startProcess(t, env)
			proc.waitConsuming(1)
			first := e.publishMany(10, 4)
			waitFor(t, 30*time.Second, "the first events applied and acked", func() bool {
				return e.inboxCount() == len(first) && proc.count("outcome", "applied") == len(first)
			})

			queueBacklog := func() []transfer {
				backlog := e.publishMany(200, 20)
				for i := range 10 {
					e.publishRaw(prefix, fmt.Sprintf("acc_poison%d_%s", i, e.name), []byte(`{"eventId": "not json`), "")
				}
				return backlog
			}
			var backlog []transfer
			var clearAlarm func()
			if alarm.restart {
				if err := proc.stop(syscall.SIGTERM, 30*time.Second); err != nil {
					t.Fatalf("exit after SIGTERM: %v", err)
				}
				backlog = queueBacklog()
				clearAlarm = alarm.set(t, ctl)
				proc = startProcess(t, env)
			} else {
				// The backlog queues while the service cannot apply: a
				// lock on the inbox holds its transactions (retried in
				// place, the environment's fault).
				release := e.lockInbox()
				backlog = queueBacklog()
				clearAlarm = alarm.set(t, ctl)
				release()
			}
			all := append(first, backlog...)
			appliedHere := len(all) // by the process that runs now
			if alarm.restart {
				appliedHere = len(backlog)
			}
			waitFor(t, 90*time.Second, "the backlog applied and acked during the alarm", func() bool {
				return e.inboxCount() == len(all) && proc.count("outcome", "applied") == appliedHere &&
					proc.count("outcome", "dead_lettered") == 10
			})
			base := proc.httpAddr()
			unprotected := sumSeries(getText(t, base+"/metrics"), "transferconsumer_journal_unprotected_events")
			if !alarmOn(t, alarm.kind) {
				t.Fatal("the alarm passed before the test could look: the result proves nothing")
			}
			if unprotected <= 0 {
				t.Errorf("%v events counted unprotected during the alarm, want those acked meanwhile", unprotected)
			}

			clearAlarm()
			waitFor(t, 90*time.Second, "every kept entry in the stream", func() bool {
				return sumSeries(getText(t, base+"/metrics"), "transferconsumer_journal_unprotected_events") == 0
			})
			waitFor(t, 60*time.Second, "the poisons' letters in the DLQ", func() bool {
				return e.ready(dlq.Queue(prefix)) >= 10 && e.outboxCount() == 0
			})
			if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
				t.Errorf("exit after SIGTERM: %v", err)
			}
			e.checkBalances(all)
			// A copy whose wait revealed the alarm may land beside its
			// parked letter (adr/0002): each poison is there, once or twice.
			if letters := e.peekDLQ(); len(letters) < 10 || len(letters) > 20 {
				t.Errorf("the DLQ holds %d letters, want the 10 poisons'", len(letters))
			}
			journaled := e.journaled([]string{e.amqpURL}, stream)
			for _, tr := range all {
				if !journaled[tr.EventID] {
					t.Errorf("event %s acked, not in the journal", tr.EventID)
				}
			}
			// Each poison's letter, parked during the alarm and its
			// message acked, is journaled too: a failover that took the
			// parking back would have it parked again.
			for i := range 10 {
				if key := fmt.Sprintf("acc_poison%d_%s", i, e.name); !journaled[letterKey(key)] {
					t.Errorf("the letter of the poison on %s, parked during the alarm, is not in the journal", key)
				}
			}
			var kept int
			if err := e.db.Get(&kept, `SELECT count(*) FROM journal_spill`); err != nil || kept != 0 {
				t.Errorf("%d journal messages still kept in the database (%v), want none", kept, err)
			}
		})
	}
}

// lockInbox locks the inbox against writes until release (or the test's
// end): the service's transactions wait, retried in place.
func (e *env) lockInbox() (release func()) {
	e.t.Helper()
	lock, err := e.db.Beginx()
	if err != nil {
		e.t.Fatal(err)
	}
	var unlock sync.Once
	release = func() { unlock.Do(func() { _ = lock.Rollback() }) }
	e.t.Cleanup(release)
	if _, err := lock.Exec(`LOCK TABLE processed_event IN SHARE MODE`); err != nil {
		e.t.Fatal(err)
	}
	return release
}

// sumSeries sums every series of a metric, whatever its labels, in a
// Prometheus text exposition; -1 when there is none.
func sumSeries(text, name string) float64 {
	ms := regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(name)+`(\{[^}]*\})? (\S+)$`).FindAllStringSubmatch(text, -1)
	if ms == nil {
		return -1
	}
	sum := 0.0
	for _, m := range ms {
		v, _ := strconv.ParseFloat(m[2], 64)
		sum += v
	}
	return sum
}

// setDiskAlarm sets the broker's disk free limit above the disk's free
// space, so that its disk alarm goes off, and waits for it. The returned
// function, also run when the test ends, puts the limit back and waits
// for the alarm to clear.
func setDiskAlarm(t *testing.T, ctl brokerCtl) (clear func()) {
	t.Helper()
	alone(t, "a disk alarm")
	previous := strings.TrimSpace(ctl.run(t, "eval", "rabbit_disk_monitor:get_disk_free_limit()."))
	if n, err := strconv.ParseInt(previous, 10, 64); err != nil || n > 1<<40 {
		// A run that died with the alarm on left its own value behind:
		// put back the broker's default, not that.
		previous = "50000000"
	}
	var once sync.Once
	clear = func() {
		once.Do(func() {
			ctl.run(t, "set_disk_free_limit", previous)
			waitFor(t, 60*time.Second, "the disk alarm to clear", func() bool { return !alarmOn(t, "disk") })
		})
	}
	t.Cleanup(clear)
	ctl.run(t, "set_disk_free_limit", strconv.FormatInt(1<<50, 10))
	waitFor(t, 60*time.Second, "the disk alarm", func() bool { return alarmOn(t, "disk") })
	return clear
}

// alarmOn reports whether any broker node has its memory or disk alarm on.
func alarmOn(t *testing.T, which string) bool {
	t.Helper()
	if which == "memory" {
		return memoryAlarm(t)
	}
	var nodes []struct {
		DiskAlarm bool `json:"disk_free_alarm"`
	}
	mgmt(t, http.MethodGet, "/api/nodes?columns=disk_free_alarm", nil, &nodes)
	for _, n := range nodes {
		if n.DiskAlarm {
			return true
		}
	}
	return false
}

// A restart or a reconnect during an alarm after entries were kept in the
// database: the queues' new lanes apply the rest of the backlog while the
// alarm lasts, as without the journal. The entries kept before are below
// the database's mark, so no read needs them in the stream first; once
// the alarm clears they reach it, before the new ones, and every acked
// event is in the journal. "reconnected": the service's broker connection
// is closed, as a network fault does; its journal's publishing connection,
// blocked by the alarm, stays (before, each new lane waited 10 s for the
// kept entries, failed, and did so again until the alarm passed).
// "restarted": a new process, whose fresh connection's first publish an
// alarm lets through. Each event's insert is slowed by a trigger until
// then, so that most of the backlog is still queued.
func TestARestartDuringAnAlarmAfterEntriesWereKeptDrainsTheBacklog(t *testing.T) {
	for _, c := range []struct {
		name    string
		restart bool
	}{{"reconnected", false}, {"restarted", true}} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			ctl := rabbitmqctl(t)
			e.declare(2)
			stream := prefix + ".journal"
			instance := e.name + "-svc"
			env := e.serviceEnv(2, "INSTANCE_NAME="+instance, "JOURNAL_STREAM="+stream)
			proc := startProcess(t, env)
			proc.waitConsuming(1)
			first := e.publishMany(10, 4)
			waitFor(t, 30*time.Second, "the first events applied and acked", func() bool {
				return e.inboxCount() == len(first) && proc.count("outcome", "applied") == len(first)
			})

			e.db.MustExec(`CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.02); RETURN NEW; END $$`)
			e.db.MustExec(`CREATE TRIGGER slow_insert BEFORE INSERT ON processed_event FOR EACH ROW EXECUTE FUNCTION slow_insert()`)
			release := e.lockInbox()
			backlog := e.publishMany(400, 20)
			all := append(first, backlog...)
			clearAlarm := setMemoryAlarm(t, ctl)
			release()
			waitFor(t, 90*time.Second, "some of the backlog applied during the alarm, its entries kept", func() bool {
				return e.inboxCount() >= len(first)+40 &&
					sumSeries(getText(t, proc.httpAddr()+"/metrics"), "transferconsumer_journal_unprotected_events") > 0
			})
			if c.restart {
				if err := proc.stop(syscall.SIGTERM, 30*time.Second); err != nil {
					t.Fatalf("exit after SIGTERM: %v", err)
				}
			} else {
				e.closeConnections(instance)
			}
			var kept int
			if err := e.db.Get(&kept, `SELECT count(*) FROM journal_spill`); err != nil || kept == 0 {
				t.Fatalf("%d journal messages kept in the database (%v): the test proves nothing", kept, err)
			}
			e.db.MustExec(`DROP TRIGGER slow_insert ON processed_event`)
			if e.inboxCount() == len(all) {
				t.Fatal("the whole backlog was applied before the restart: the test proves nothing")
			}
			if c.restart {
				proc = startProcess(t, env)
			}
			waitFor(t, 90*time.Second, "the rest of the backlog applied during the alarm", func() bool {
				return e.inboxCount() == len(all)
			})
			if !alarmOn(t, "memory") {
				t.Fatal("the alarm passed before the test could look: the result proves nothing")
			}
			clearAlarm()
			base := proc.httpAddr()
			waitFor(t, 90*time.Second, "every kept entry in the stream", func() bool {
				var n int
				return sumSeries(getText(t, base+"/metrics"), "transferconsumer_journal_unprotected_events") == 0 &&
					e.db.Get(&n, `SELECT count(*) FROM journal_spill`) == nil && n == 0
			})
			if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
				t.Errorf("exit after SIGTERM: %v", err)
			}
			e.checkBalances(all)
			journaled := e.journaled([]string{e.amqpURL}, stream)
			for _, tr := range all {
				if !journaled[tr.EventID] {
					t.Errorf("event %s acked, not in the journal", tr.EventID)
				}
			}
		})
	}
}
