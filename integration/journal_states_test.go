package integration

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The journal's states that its alerts name (prometheus/alerts.yml), each
// made for real, with the series the rule reads checked in the service's
// /metrics and the rule itself evaluated by a real Prometheus (Debian's
// package, as TestTheDashboardAgainstARealPrometheus runs it) scraping the
// service every second: pending while the state lasts, gone once it
// passes. The journal's rules read only the service's series, so the
// broker's plugin is not scraped, and the tests run against every broker
// version. How long a rule waits before it fires (for:) is promtool's to
// prove (alerts_test.yml).

// A memory alarm raised with a backlog queued: the backlog is applied
// and acked while the alarm lasts, its journal entries kept in the
// database (TestAnAlarmWithTheJournalDoesNotStopTheBacklog), and
// transferconsumer_journal_unprotected_events stays above 0 at every look
// for as long as the alarm is held: here 15 s, three of the journal
// writer's tries of the stream at its slowest, each of which fails; with
// TransferConsumerJournalUnprotected pending throughout. Once the alarm
// clears the entries reach the stream, the count is 0, and the rule is no
// longer pending.
func TestEntriesKeptDuringAnAlarmAreUnprotectedWhileItLasts(t *testing.T) {
	bin := prometheusPath(t)
	e := newEnv(t)
	ctl := rabbitmqctl(t)
	e.declare(2)
	stream := prefix + ".journal"
	proc := startProcess(t, e.serviceEnv(2, "INSTANCE_NAME="+e.name+"-svc", "JOURNAL_STREAM="+stream))
	proc.waitConsuming(1)
	base := proc.httpAddr()
	prom := startPrometheus(t, bin, strings.TrimPrefix(base, "http://"), "", "")
	const rule = "TransferConsumerJournalUnprotected"

	release := e.lockInbox()
	backlog := e.publishMany(100, 10)
	clearAlarm := setMemoryAlarm(t, ctl)
	release()
	waitFor(t, 90*time.Second, "the backlog applied and acked during the alarm", func() bool {
		return e.inboxCount() == len(backlog) && proc.count("outcome", "applied") == len(backlog)
	})
	unprotected := func() float64 {
		return sumSeries(getText(t, base+"/metrics"), "transferconsumer_journal_unprotected_events")
	}
	const held = 15 * time.Second
	start, looks, least := time.Now(), 0, float64(len(backlog))
	waitFor(t, held+60*time.Second, rule+" pending, the events unprotected for "+held.String(), func() bool {
		n := unprotected()
		if n <= 0 {
			t.Fatalf("%v events unprotected %s into the alarm, after %d looks above 0; want those acked during it, until it passes",
				n, time.Since(start).Round(time.Millisecond), looks)
		}
		looks, least = looks+1, min(least, n)
		return time.Since(start) >= held && alertState(t, prom, rule) == "pending"
	})
	if !alarmOn(t, "memory") {
		t.Fatal("the alarm passed before the test could look: the result proves nothing")
	}
	t.Logf("%v events unprotected, at least %v at each of %d looks over %s of the alarm; %s pending",
		unprotected(), least, looks, time.Since(start).Round(time.Second), rule)

	clearAlarm()
	waitFor(t, 90*time.Second, "every kept entry in the stream, and "+rule+" no longer pending", func() bool {
		return unprotected() == 0 && alertState(t, prom, rule) == ""
	})
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	e.checkExactlyOnce(backlog)
	journaled := e.journaled([]string{e.amqpURL}, stream)
	for _, tr := range backlog {
		if !journaled[tr.EventID] {
			t.Errorf("event %s acked, not in the journal", tr.EventID)
		}
	}
}

// A queue that must read the journal before it goes on (the database no
// longer vouches for its mark: its row written again, as a restore writes
// it) while the service's user may not read the stream: the queue holds
// its event, blocked with reason journal-unvouched in
// transferconsumer_queue_blocked_reason (before, "other"), and
// TransferConsumerJournalUnreadable is pending. Once the user may read it
// again, the queue goes on, the reason is gone, and so is the rule.
func TestAQueueHeldByAJournalItCannotReadSaysSo(t *testing.T) {
	parallel(t)
	bin := prometheusPath(t)
	e := newEnv(t)
	e.declare(1)
	stream := prefix + ".journal"
	env := e.serviceEnv(1, "INSTANCE_NAME="+e.name+"-svc", "JOURNAL_STREAM="+stream)
	proc := startProcess(t, env)
	proc.waitConsuming(1)
	first := e.publishMany(3, 2)
	waitFor(t, 30*time.Second, "the first events applied", func() bool { return proc.count("outcome", "applied") == len(first) })
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	res, err := e.db.Exec(`UPDATE journal_mark SET seq = seq`)
	if n, _ := res.RowsAffected(); err != nil || n != 1 {
		t.Fatalf("the queue's mark made unvouched: %d rows (%v), want 1", n, err)
	}
	perms := "/api/permissions/" + url.PathEscape(e.vhost) + "/" + url.PathEscape(e.b.adminUser())
	readOnly := func(read string) {
		e.b.mgmt(t, http.MethodPut, perms, map[string]string{"configure": ".*", "write": ".*", "read": read}, nil)
	}
	readOnly(`^(?!` + regexp.QuoteMeta(stream) + `$).*`) // every queue but the stream
	t.Cleanup(func() { readOnly(".*") })

	events := e.publishMany(4, 2)
	proc = startProcess(t, env)
	base := proc.httpAddr()
	prom := startPrometheus(t, bin, strings.TrimPrefix(base, "http://"), "", "")
	const rule = "TransferConsumerJournalUnreadable"
	queue := e.topology(1).Queue(0)
	blocked := func(reason string) float64 {
		return metricSum(getText(t, base+"/metrics"), "transferconsumer_queue_blocked_reason", `queue="`+queue+`"`, `reason="`+reason+`"`)
	}
	reasons := regexp.MustCompile(`(?m)^transferconsumer_queue_blocked_reason\{.*$`)
	said := ""
	waitFor(t, 60*time.Second, "the queue blocked with reason journal-unvouched, and "+rule+" pending", func() bool {
		if now := strings.Join(reasons.FindAllString(getText(t, base+"/metrics"), -1), "; "); now != said {
			t.Logf("%s", now)
			said = now
		}
		return blocked("journal-unvouched") == 1 && alertState(t, prom, rule) == "pending"
	})
	if n := blocked("other"); n != -1 {
		t.Errorf("the queue also blocked with reason other (%v)", n)
	}
	if n := proc.count("outcome", "applied"); n != 0 {
		t.Fatalf("%d events applied while the journal could not be read and the mark was not vouched for, want none", n)
	}

	readOnly(".*")
	waitFor(t, 60*time.Second, "every event applied once the journal can be read, the queue unblocked, and "+rule+" gone", func() bool {
		return proc.count("outcome", "applied") == len(events) && blocked("journal-unvouched") == -1 && alertState(t, prom, rule) == ""
	})
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	e.checkExactlyOnce(append(first, events...))
}

// alertState is the state of the alert rule name in prom: pending,
// firing, or "" when its expression holds for nothing.
func alertState(t *testing.T, prom *promServer, name string) string {
	t.Helper()
	got, err := prom.query(`ALERTS{alertname="` + name + `"}`)
	if err != nil {
		t.Fatal(err)
	}
	state := ""
	for _, s := range got {
		if state != "firing" {
			state = s.Metric["alertstate"]
		}
	}
	return state
}
