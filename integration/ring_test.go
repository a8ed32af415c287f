package integration

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/event"
)

// fiveDaysAgo is an SQL time in a slot of the inbox ring other than
// today's, and not due for retention (adr/0009).
const fiveDaysAgo = `(now() - interval '5 days')`

// moveToSlotOf moves eventID's inbox row to the slot of the SQL time at,
// as if it had been claimed then.
func (e *env) moveToSlotOf(eventID, at string) {
	e.t.Helper()
	r := e.db.MustExec(`UPDATE processed_event SET processed_at = `+at+`, slot = inbox_slot(`+at+`) WHERE event_id = $1`, eventID)
	if n, _ := r.RowsAffected(); n != 1 {
		e.t.Fatalf("moved %d inbox rows of %s, want 1", n, eventID)
	}
}

// decided waits until svc decided about eventID n times, and returns the
// decisions.
func decided(t *testing.T, svc *service, eventID string, n int) []consumer.Decision {
	t.Helper()
	var ds []consumer.Decision
	waitFor(t, 30*time.Second, fmt.Sprintf("%d decisions about %s", n, eventID), func() bool {
		ds = svc.rec.of(eventID)
		return len(ds) >= n
	})
	return ds
}

// A redelivery whose original claim sits in an older slot of the ring is
// a duplicate, and the same eventId with other content a producer
// conflict: each claim looks in every live slot, not only its own.
func TestDuplicateOfAnOriginalInAnOlderSlotIsCaught(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	svc := e.start(2, nil)
	from, to := "acc_r1_"+e.name, "acc_r2_"+e.name
	tr := newTransfer(from, to, 40)
	e.publish(tr)
	if ds := decided(t, svc, tr.EventID, 1); ds[0].Duplicate || ds[0].Action != consumer.ActionAck {
		t.Fatalf("the original: %+v, want applied", ds[0])
	}
	e.moveToSlotOf(tr.EventID, fiveDaysAgo)

	e.publish(tr)
	if ds := decided(t, svc, tr.EventID, 2); !ds[1].Duplicate {
		t.Errorf("the redelivery: %+v, want a duplicate", ds[1])
	}
	other := tr
	other.Data.AmountMinor = 41
	e.publish(other)
	if ds := decided(t, svc, tr.EventID, 3); ds[2].Class != event.ClassConflict {
		t.Errorf("other content under the eventId: %+v, want a producer conflict", ds[2])
	}
	if b := e.balance(to); b != 40 {
		t.Errorf("%s balance %d, want 40: applied once", to, b)
	}
	if n := e.inboxRows(tr.EventID); n != 1 {
		t.Errorf("%d inbox rows of the event, want its one", n)
	}
}

// While retention empties a slot, a duplicate whose original sits in
// another slot is caught: its claim's lookup waits for the TRUNCATE's
// commit, then finds the original. The TRUNCATE is made to wait behind a
// lock the test holds on the slot, the duplicate is sent, and the test
// sees its claim wait behind the TRUNCATE before it lets go.
func TestDuplicateDuringATruncateIsCaught(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	svc := e.start(2, nil)
	from, to := "acc_t1_"+e.name, "acc_t2_"+e.name
	tr := newTransfer(from, to, 70)
	e.publish(tr)
	decided(t, svc, tr.EventID, 1)
	e.moveToSlotOf(tr.EventID, fiveDaysAgo)
	e.insertInboxRows(1000, expiredDay)
	var part string
	if err := e.db.Get(&part, `SELECT format('processed_event_s%s', lpad(inbox_slot(`+expiredDay+`)::text, 2, '0'))`); err != nil {
		t.Fatal(err)
	}

	hold, err := e.db.Beginx()
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	hold.MustExec(`LOCK TABLE ` + part + ` IN ACCESS SHARE MODE`)
	pruneDB, err := db.Open(context.Background(), e.dbURL, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer pruneDB.Close()
	type result struct {
		res db.PruneResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		r := db.Retention{TTL: 720 * time.Hour, Batch: 100, LockTimeout: time.Minute, Attempts: 1}
		res, err := r.Run(context.Background(), pruneDB)
		done <- result{res, err}
	}()
	waiting := func(mode string) func() bool {
		return func() bool {
			var n int
			e.db.Get(&n, `SELECT count(*) FROM pg_locks WHERE relation = $1::regclass AND mode = $2 AND NOT granted`, part, mode)
			return n > 0
		}
	}
	waitFor(t, 30*time.Second, "the TRUNCATE to wait for "+part, waiting("AccessExclusiveLock"))

	e.publish(tr)
	waitFor(t, 30*time.Second, "the duplicate's claim to wait behind the TRUNCATE", waiting("AccessShareLock"))
	if n := len(svc.rec.of(tr.EventID)); n != 1 {
		t.Fatalf("the duplicate was decided while the slot was held (%d decisions)", n)
	}
	hold.Rollback()

	pr := <-done
	if pr.err != nil || len(pr.res.Truncated) != 1 {
		t.Errorf("retention = %+v, %v; want %s emptied", pr.res, pr.err, part)
	}
	if ds := decided(t, svc, tr.EventID, 2); !ds[1].Duplicate {
		t.Errorf("the duplicate sent during the TRUNCATE: %+v, want a duplicate", ds[1])
	}
	if b := e.balance(to); b != 70 {
		t.Errorf("%s balance %d, want 70: applied once", to, b)
	}
	var left int
	e.db.Get(&left, `SELECT count(*) FROM `+part)
	if left != 0 {
		t.Errorf("%s holds %d rows after retention, want 0", part, left)
	}
	if n := e.inboxRows(tr.EventID); n != 1 {
		t.Errorf("%d inbox rows of the event, want its one", n)
	}
}

// An INBOX_TTL longer than the ring covers is said: in /readyz (which stays
// ready: nothing is forgotten early), in the metric an alert compares with
// INBOX_TTL, and in the log, once however often retention runs; until the
// owner's migrate, given that TTL, grows the ring. (That retention empties
// no slot the TTL protects meanwhile is db.TestPruneWithTTLBeyondTheRing.)
func TestInboxTTLBeyondTheRingIsSaid(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(1)
	proc := startProcess(t, e.serviceEnv(1, "INSTANCE_NAME="+e.name+"-svc", "INBOX_TTL=800h", "PRUNE_INTERVAL=50ms"))
	proc.waitConsuming(1)
	base := proc.httpAddr()
	var ready map[string]any
	waitFor(t, 30*time.Second, "/readyz to name the ring", func() bool {
		code := getJSON(t, base+"/readyz", &ready)
		return code == 200 && ready["inbox"] != nil
	})
	if w := fmt.Sprint(ready["inbox"]); !strings.Contains(w, "INBOX_TTL (800h0m0s) is longer than the inbox ring covers (32 slots of 24h0m0s: 720h0m0s)") {
		t.Errorf("/readyz inbox = %q", w)
	}
	metrics := getText(t, base+"/metrics")
	if v := metricValue(metrics, "transferconsumer_inbox_ring_covers_seconds"); v != 30*24*3600 {
		t.Errorf("transferconsumer_inbox_ring_covers_seconds = %v, want 30 days", v)
	}
	if v := metricValue(metrics, "transferconsumer_inbox_ttl_seconds"); v != 800*3600 {
		t.Errorf("transferconsumer_inbox_ttl_seconds = %v, want 800h", v)
	}

	// The owner's migrate with that TTL grows the ring; the service's next
	// retention run reads it, and the warning goes.
	out, err := runCommand(t, []string{"DATABASE_URL=" + e.dbURL, "INBOX_TTL=800h"}, "migrate")
	if err != nil || !strings.Contains(out, "grew the inbox ring to 36 slots of 24h0m0s") {
		t.Fatalf("migrate with INBOX_TTL=800h: %v\n%s", err, out)
	}
	waitFor(t, 30*time.Second, "/readyz without the warning", func() bool {
		ready = nil
		return getJSON(t, base+"/readyz", &ready) == 200 && ready["inbox"] == nil
	})
	if v := metricValue(getText(t, base+"/metrics"), "transferconsumer_inbox_ring_covers_seconds"); v != 34*24*3600 {
		t.Errorf("transferconsumer_inbox_ring_covers_seconds = %v after migrate, want 34 days", v)
	}
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	if n := proc.countAnyContaining("msg", "is longer than the inbox ring covers"); n != 1 {
		t.Errorf("the warning was logged %d times, want once", n)
	}
}
