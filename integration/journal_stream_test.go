package integration

import (
	"net/http"
	"net/url"
	"syscall"
	"testing"
	"time"
)

// The journal's stream failing under the running service: refusing its
// entries, or deleted.

// While the stream does not take the journal's entries, they are kept in
// the database and the events acked: nothing waits and nothing is
// dead-lettered, and the acked events whose entries are only in the
// database are counted unprotected. Here the service's user loses its
// permissions on the stream and the journal's connection is closed, so the
// journal cannot open its stream again; once the permissions are back,
// the kept entries are written to the stream, the count is back at 0, and
// every event is applied once and is in the journal.
func TestAStreamThatRefusesTheJournalKeepsItsEntriesUntilItHeals(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(2)
	readme := readmeGrants(t)
	withJournal := readme["the service with the journal, `JOURNAL_STREAM=transfers.journal`"]
	svcURL := e.brokerUser("svc", withJournal, "")
	user := e.name + "_svc"
	instance := e.name + "-svc"
	proc := startProcess(t, e.serviceEnv(2, "AMQP_URL="+svcURL, "INSTANCE_NAME="+instance,
		"JOURNAL_STREAM="+prefix+".journal", "JOURNAL_KEEP_AFTER=200ms"))
	proc.waitConsuming(1)
	before := e.publishMany(20, 4)
	waitFor(t, 30*time.Second, "the first events applied and acked", func() bool {
		return e.inboxCount() == len(before) && proc.count("outcome", "applied") == len(before)
	})

	e.setPermissions(user, readme["the service, `DECLARE_TOPOLOGY=true` (the default)"]) // nothing on the stream
	e.closeConnections(instance + "-journal")
	after := e.publishMany(40, 4)
	all := append(before, after...)
	base := proc.httpAddr()
	waitFor(t, 60*time.Second, "later events applied and acked, their entries kept in the database", func() bool {
		return e.inboxCount() == len(all) && proc.count("outcome", "applied") == len(all) &&
			proc.count("msg", journalKept) > 0
	})
	if n := sumSeries(getText(t, base+"/metrics"), "transferconsumer_journal_unprotected_events"); n <= 0 {
		t.Errorf("%v events counted unprotected while the stream refuses the journal, want those acked meanwhile", n)
	}

	e.setPermissions(user, withJournal)
	waitFor(t, 60*time.Second, "every kept entry in the stream once it takes the journal again", func() bool {
		return sumSeries(getText(t, base+"/metrics"), "transferconsumer_journal_unprotected_events") == 0
	})
	var ready map[string]any
	if code := getJSON(t, base+"/readyz", &ready); code != 200 {
		t.Errorf("/readyz %d, want 200: %v", code, ready)
	}
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	e.checkExactlyOnce(all)
	if n := proc.count("outcome", "dead_lettered"); n != 0 {
		t.Errorf("%d events dead-lettered", n)
	}
	journaled := e.journaled([]string{e.amqpURL}, prefix+".journal")
	for _, tr := range all {
		if !journaled[tr.EventID] {
			t.Errorf("event %s acked, not in the journal", tr.EventID)
		}
	}
}

// A stream deleted under the running service does not swallow the
// journal: its entries come back unroutable instead of being confirmed
// into nothing, they are kept in the database meanwhile, the write is
// tried again on a new channel, which declares the stream again, and every
// event acked after the deletion is in the new stream. (Published to the default exchange without mandatory, they were
// confirmed and dropped, and their events acked unjournaled.)
func TestAStreamDeletedUnderTheServiceLosesNoEntry(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(2)
	stream := prefix + ".journal"
	proc := startProcess(t, e.serviceEnv(2, "INSTANCE_NAME="+e.name+"-svc", "JOURNAL_STREAM="+stream))
	proc.waitConsuming(1)
	before := e.publishMany(20, 4)
	waitFor(t, 30*time.Second, "the first events applied and acked", func() bool {
		return e.inboxCount() == len(before) && proc.count("outcome", "applied") == len(before)
	})
	e.b.mgmt(t, http.MethodDelete, "/api/queues/"+url.PathEscape(e.vhost)+"/"+url.PathEscape(stream), nil, nil)
	after := e.publishMany(40, 4)
	all := append(before, after...)
	waitFor(t, 60*time.Second, "every event applied and acked", func() bool {
		return e.inboxCount() == len(all) && proc.count("outcome", "applied") == len(all)
	})
	if n := proc.count("msg", journalKept); n == 0 {
		t.Errorf("the service did not say the stream refused an entry")
	}
	// What the gone stream refused was kept in the database and acked;
	// it reaches the stream declared again once the writer tries it.
	base := proc.httpAddr()
	waitFor(t, 60*time.Second, "every kept entry in the stream declared again", func() bool {
		return sumSeries(getText(t, base+"/metrics"), "transferconsumer_journal_unprotected_events") == 0
	})
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	e.checkExactlyOnce(all)
	journaled := e.journaled([]string{e.amqpURL}, stream)
	for _, tr := range after {
		if !journaled[tr.EventID] {
			t.Errorf("event %s, acked after the stream was deleted, is not in the stream declared again", tr.EventID)
		}
	}
}

// journalKept is what the service logs when the stream did not take a
// queue's entries and it keeps them in the database.
const journalKept = "journal: the stream does not take the entries; they are kept in the database until it does, and their events acked"

// setPermissions sets user's permissions on e's vhost to g.
func (e *env) setPermissions(user string, g grants) {
	e.t.Helper()
	e.b.mgmt(e.t, http.MethodPut, "/api/permissions/"+url.PathEscape(e.vhost)+"/"+url.PathEscape(user),
		map[string]string{"configure": g.configure, "write": g.write, "read": g.read}, nil)
}
