package integration

import (
	"encoding/json"
	"fmt"
	"syscall"
	"testing"
	"time"

	"transferconsumer/journal"
)

// What a start (or a handover: the next replica's start) reads of the
// journal is bounded by JOURNAL_CLOCK_SKEW: from that long before the
// earliest time a queue's mark last moved, up to a fence, not the whole
// stream. Here a first stretch of events is journaled, then, past the
// skew, every queue's mark moves again; the service started next reads
// fewer bytes than the first stretch's events hold, and one started with
// a skew of an hour (the former 10 minutes' behaviour) reads them all.
// Both figures are logged: the bytes a handover reads.
func TestAStartReadsTheJournalOnlyFromTheSkewBeforeTheMarks(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	const queues = 2
	e.declare(queues)
	stream := prefix + ".journal"
	env := func(skew string) []string {
		return e.serviceEnv(queues, "INSTANCE_NAME="+e.name+"-svc", "JOURNAL_STREAM="+stream, "JOURNAL_CLOCK_SKEW="+skew)
	}
	a := startProcess(t, env("1s"))
	old, oldBytes := journalStretch(t, e, a)
	// Past the skew, every queue's mark moves again.
	past := time.Now().Add(2 * time.Second)
	waitFor(t, 30*time.Second, "two seconds past the first stretch", func() bool { return time.Now().After(past) })
	applied := len(old)
	for k := 0; ; k++ {
		var moved int
		if err := e.db.Get(&moved, `SELECT count(*) FROM journal_mark WHERE at > $1`, past); err != nil {
			t.Fatal(err)
		}
		if moved == queues {
			break
		}
		if k == 64 {
			t.Fatalf("64 keys moved %d of %d queues' marks", moved, queues)
		}
		e.publish(newTransfer(fmt.Sprintf("acc_late%02d_%s", k, e.name), "acc_late_to_"+e.name, 1))
		applied++
		waitFor(t, 30*time.Second, "the late event applied", func() bool { return e.inboxCount() == applied })
	}
	if err := a.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}

	bounded, whole := readAtStart(t, env("1s")), readAtStart(t, env("1h"))
	t.Logf("a start read %.0f bytes of the journal with a skew of 1s, %.0f with 1h; the first stretch's events hold %d bytes",
		bounded, whole, oldBytes)
	if bounded < 0 || bounded >= float64(oldBytes) {
		t.Errorf("a start with a skew of 1s read %.0f bytes, want fewer than the %d of the stretch before it", bounded, oldBytes)
	}
	if whole < float64(oldBytes) {
		t.Errorf("a start with a skew of 1h read %.0f bytes, want the whole stretch's %d at least: the test shows nothing", whole, oldBytes)
	}
}

// An idle queue's mark may have last moved days ago; a start then read
// the journal from there, every queue's entries since, at every start.
// Each read that syncs a queue now raises its mark's time to when the read
// began (db's Vouch): the next start reads back only to the last read that
// synced it. Here a queue's stretch of events is journaled and its mark
// aged by an hour (idle since); the first start reads the whole stretch,
// and the one after it, nothing of it.
func TestAnIdleQueuesStartReadsBackOnlyToTheLastReadThatSyncedIt(t *testing.T) {
	parallel(t)
	e, env, a, stretchBytes := oneQueueWithAStretch(t)
	if err := a.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	// Idle for an hour, as far as the mark says; and past the skew.
	if _, err := e.db.Exec(`UPDATE journal_mark SET at = at - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(2 * time.Second)
	waitFor(t, 30*time.Second, "two seconds past the stretch", func() bool { return time.Now().After(past) })
	first, second := readAtStart(t, env), readAtStart(t, env)
	t.Logf("an idle queue's first start read %.0f bytes of the journal, the next %.0f; the stretch's events hold %d bytes",
		first, second, stretchBytes)
	if first < float64(stretchBytes) {
		t.Errorf("the first start read %.0f bytes, want the stretch's %d at least: the test shows nothing", first, stretchBytes)
	}
	if second < 0 || second >= float64(stretchBytes) {
		t.Errorf("the start after it read %.0f bytes, want fewer than the stretch's %d: it read back to the mark's move again", second, stretchBytes)
	}
}

// A service that runs for weeks without a restart read, at its next
// start, an idle queue's journal back to the last read that synced it:
// weeks. The watch's check of an idle queue, every 30 s, now raises its
// mark's time to when the check began, the mark being where the lane left
// it and vouched for in this database. Here the mark is aged by an hour
// while the service runs: its check brings the time back within the
// minute, and the next start reads nothing of the stretch before it.
func TestAnIdleQueuesMarkTimeFollowsTheWatchsChecks(t *testing.T) {
	parallel(t)
	e, env, a, stretchBytes := oneQueueWithAStretch(t)
	if _, err := e.db.Exec(`UPDATE journal_mark SET at = at - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*journal.CheckEvery, "the watch's check to raise the idle queue's mark time", func() bool {
		var recent bool
		e.db.Get(&recent, `SELECT bool_and(at > now() - interval '1 minute') FROM journal_mark`)
		return recent
	})
	if err := a.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	past := time.Now().Add(2 * time.Second)
	waitFor(t, 30*time.Second, "two seconds past the stretch", func() bool { return time.Now().After(past) })
	next := readAtStart(t, env)
	t.Logf("the start after a run whose watch checked the idle queue read %.0f bytes of the journal; the stretch's events hold %d bytes",
		next, stretchBytes)
	if next < 0 || next >= float64(stretchBytes) {
		t.Errorf("the start read %.0f bytes, want fewer than the stretch's %d: it read back to before the watch's check", next, stretchBytes)
	}
}

// oneQueueWithAStretch starts the service, with the journal and a clock
// skew of 1 s, on a new world of one queue, and has it apply a stretch
// of events (journalStretch): it returns the world, the service's
// environment, the process, and the bytes of the stretch's bodies.
func oneQueueWithAStretch(t *testing.T) (*env, []string, *process, int) {
	t.Helper()
	e := newEnv(t)
	e.declare(1)
	env := e.serviceEnv(1, "INSTANCE_NAME="+e.name+"-svc", "JOURNAL_STREAM="+prefix+".journal", "JOURNAL_CLOCK_SKEW=1s")
	a := startProcess(t, env)
	_, stretchBytes := journalStretch(t, e, a)
	return e, env, a, stretchBytes
}

// journalStretch has p, once consuming, apply and ack a stretch of 300
// events, and returns them with the bytes of their bodies.
func journalStretch(t *testing.T, e *env, p *process) ([]transfer, int) {
	t.Helper()
	p.waitConsuming(1)
	stretch := e.publishMany(300, 8)
	waitFor(t, 60*time.Second, "the stretch applied and acked", func() bool {
		return e.inboxCount() == len(stretch) && p.count("outcome", "applied") == len(stretch)
	})
	n := 0
	for _, tr := range stretch {
		b, _ := json.Marshal(tr)
		n += len(b)
	}
	return stretch, n
}

// readAtStart starts the service with env, and returns how many bytes
// of the journal its start read (transferconsumer_journal_read_bytes_total)
// once it consumes; then it stops it.
func readAtStart(t *testing.T, env []string) float64 {
	t.Helper()
	p := startProcess(t, env)
	// The start reads the stream before it consumes; beside the other
	// tests, under -race, that has taken over a minute here.
	waitFor(t, 3*time.Minute, "the service to consume after its start's read of the journal",
		func() bool { return p.count("msg", "consuming") >= 1 })
	n := metricValue(getText(t, p.httpAddr()+"/metrics"), "transferconsumer_journal_read_bytes_total")
	if err := p.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	return n
}
