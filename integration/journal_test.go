package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	amqp "github.com/rabbitmq/amqp091-go"
)

// With the journal on (JOURNAL_STREAM), the loss
// TestFailoverToAnAsynchronousStandbyLosesAckedEvents shows does not
// happen: the standby is held behind while the service applies and acks
// events, the primary crashes and the standby is promoted. With no event
// published meanwhile, the service, at its reconnect to the new primary,
// compares each queue's journal mark with the database's, reads the
// entries the database lacks from the journal, applies them again in
// order, and goes on once events come again: every event is
// applied exactly once, balances are right, each account's events are
// applied in their order, nothing is dead-lettered, at BATCH_MAX 1 and 50.
func TestFailoverToAnAsynchronousStandbyWithTheJournalLosesNothing(t *testing.T) {
	parallel(t)
	for _, batch := range []int{1, 50} {
		t.Run(fmt.Sprintf("BATCH_MAX %d", batch), func(t *testing.T) {
			t.Parallel() // each on servers of its own
			primary, standby, admin, replication := asyncPair(t)
			e := newEnvOn(t, primary.adminURL())
			e.declare(2)
			e.recordApplyOrder()

			proc := startProcess(t, e.serviceEnv(2, "DATABASE_URL="+failoverURL(false, e.name, primary, standby),
				fmt.Sprintf("BATCH_MAX=%d", batch), "APPLY_TIMEOUT=5s", "JOURNAL_STREAM="+prefix+".journal"))
			proc.waitConsuming(1)

			before := e.publishMany(100, 8)
			waitFor(t, 60*time.Second, "the first events applied", func() bool { return e.inboxCount() == len(before) })
			caughtUp(t, admin, standby)

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
			lost := e.missing(after)
			t.Logf("the new primary lacks %d of the %d events acked while the standby was behind", lost, len(after))
			if lost == 0 {
				t.Fatalf("no acked event is missing on the new primary: the test held nothing back")
			}
			// No event comes until the lost ones are back: the service
			// finds them when it reconnects, not at a queue's next event.
			waitFor(t, 120*time.Second, "the lost events applied again before any new event", func() bool {
				return e.inboxCount() == len(before)+len(after)
			})

			more := transfers(e, 100, 8)
			for _, tr := range more {
				e.publish(tr)
			}
			e.checkRestored(proc, append(append(before, after...), more...), lost)
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
// earlier time would have left it. The loss is accepted more than
// JOURNAL_CLOCK_SKEW after the entries left were written, and they are
// still restored: the mark reaches the journal's tail before the event in
// hand takes the next sequence (before, the accepted loss's move set the
// mark's time to its commit, the restore read from there, found none of
// them, and the event in hand took a sequence the journal already held).
func TestAGapOlderThanTheJournalIsReportedAndItsQueueWaits(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	e.declare(1)
	stream := prefix + ".journal"
	ch := e.declareStream(stream, amqp.Table{"x-max-length-bytes": int64(20000), "x-stream-max-segment-size-bytes": int64(4000)})
	env := e.serviceEnv(1, "DECLARE_TOPOLOGY=false", "JOURNAL_STREAM="+stream, "JOURNAL_CLOCK_SKEW=1s")
	proc := startProcess(t, env)
	proc.waitConsuming(1)
	events := e.publishMany(200, 4)
	waitFor(t, 60*time.Second, "the events applied and acked", func() bool {
		return e.inboxCount() == len(events) && proc.count("outcome", "applied") == len(events)
	})
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	// The stream's retention runs apart from its writes: wait until it has
	// taken the entry after the mark the test sets.
	waitFor(t, 60*time.Second, "the stream's retention to drop its first entries", func() bool {
		return firstJournalEntry(t, ch, stream) > 51
	})
	e.db.MustExec(`UPDATE journal_mark SET seq = 50, at = now() - interval '1 hour' WHERE queue = $1`, prefix+".0")

	proc = startProcess(t, env)
	const short = "cannot be restored whole"
	// The watch checks at once, then every 30 s; a check cut short on a
	// loaded machine (its read is bounded by 10 s) says why, and the next
	// says this.
	waitFor(t, 2*time.Minute, "the service to say the journal does not reach back", func() bool {
		return proc.said(journalCheckFailed, "err", short)
	})
	held := e.publishMany(1, 4)
	waitFor(t, 60*time.Second, "the queue blocked on the event in hand, for that reason", func() bool {
		return proc.said("queue blocked: the environment failed, retrying the message in place", "err", short)
	})
	if n := e.inboxRows(held[0].EventID); n != 0 {
		t.Fatalf("the event in hand was applied while the queue waited")
	}
	out, err := runCommand(t, env, "recover")
	if err == nil || !strings.Contains(out, short) || !strings.Contains(out, "up to ") || !strings.Contains(out, "--accept-loss") {
		t.Fatalf("recover: %v\n%s\nwant exit 1 and the queue's loss named", err, out)
	}
	t.Logf("recover says: %s", out)
	past := time.Now().Add(2 * time.Second) // the entries left are older than the skew
	waitFor(t, 30*time.Second, "two seconds past the entries", func() bool { return time.Now().After(past) })
	out, err = runCommand(t, env, "recover", "--accept-loss")
	if err != nil || !strings.Contains(out, "accepted the loss of up to ") {
		t.Fatalf("recover --accept-loss: %v\n%s", err, out)
	}
	waitFor(t, 60*time.Second, "the event in hand applied once the loss was accepted", func() bool {
		return e.inboxRows(held[0].EventID) == 1
	})
	var mark int64
	if err := e.db.Get(&mark, `SELECT seq FROM journal_mark WHERE queue = $1`, prefix+".0"); err != nil {
		t.Fatal(err)
	}
	if want := int64(len(events) + 1); mark != want {
		t.Errorf("the queue's mark is %d after the loss was accepted and the event in hand applied, want %d: "+
			"the journal's entries after the loss restored, then the event in hand", mark, want)
	}
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	e.checkExactlyOnce(append(events, held...))
}

// A point-in-time restore to a moment under load loses nothing with the
// journal on: the primary archives its WAL, a base backup is taken, the
// service applies and acks events, and the database is restored
// (pg_basebackup, the WAL archive, recovery_target_time) to a moment
// halfway through. The events acked after that moment are gone from the
// restored database and from the broker; the service, started against the
// restored database, applies them again from the journal before it
// consumes, in order, and goes on: each event once, balances right, each
// account's order kept, nothing dead-lettered.
func TestAPointInTimeRestoreWithTheJournalLosesNothing(t *testing.T) {
	parallel(t) // on a server of its own
	primary := newPGCluster(t)
	archive := pgDataDir(t)
	f, err := os.OpenFile(filepath.Join(primary.dir, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "archive_mode = on\narchive_command = 'cp %%p %s/%%f'\n", archive)
	f.Close()
	primary.stop()
	primary.start()
	admin := sqlx.MustOpen("postgres", primary.adminURL())
	t.Cleanup(func() { admin.Close() })
	e := newEnvOn(t, primary.adminURL())
	e.declare(2)
	e.recordApplyOrder()
	env := []string{"APPLY_TIMEOUT=5s", "JOURNAL_STREAM=" + prefix + ".journal"}

	proc := startProcess(t, e.serviceEnv(2, append(env, "DATABASE_URL="+failoverURL(false, e.name, primary))...))
	proc.waitConsuming(1)
	before := e.publishMany(100, 8)
	waitFor(t, 60*time.Second, "the first events applied", func() bool { return e.inboxCount() == len(before) })
	backup := pgDataDir(t)
	primary.run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(primary.port), "-U", "postgres",
		"-D", backup, "-X", "stream", "-c", "fast", "--no-sync")

	load := transfers(e, 600, 8)
	var published atomic.Int64
	if err := e.publishPipelined(load, &published); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "a third of the load applied", func() bool { return e.inboxCount() >= len(before)+len(load)/3 })
	var target string
	admin.Get(&target, `SELECT now()::text`)
	waitFor(t, 60*time.Second, "the whole load applied and acked", func() bool {
		return e.inboxCount() == len(before)+len(load) && e.ready(prefix+".0")+e.ready(prefix+".1") == 0 &&
			proc.count("outcome", "applied") == len(before)+len(load)
	})
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	var segment string
	admin.Get(&segment, `SELECT pg_walfile_name(pg_switch_wal())`)
	waitFor(t, 60*time.Second, "the WAL archived up to the end of the load", func() bool {
		var archived string
		admin.Get(&archived, `SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver`)
		return archived >= segment
	})
	primary.stopQuietly()

	// The restore: the base backup, the archive, the target.
	restored := &pgCluster{t: t, bin: primary.bin, dir: backup}
	f, err = os.OpenFile(filepath.Join(backup, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "archive_mode = off\nrestore_command = 'cp %s/%%f %%p'\nrecovery_target_time = '%s'\nrecovery_target_action = 'promote'\n", archive, target)
	f.Close()
	if err := os.WriteFile(filepath.Join(backup, "recovery.signal"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	restored.port = freePort(t)
	restored.start()
	restoredAdmin := sqlx.MustOpen("postgres", restored.adminURL())
	t.Cleanup(func() { restoredAdmin.Close() })
	waitFor(t, 120*time.Second, "the restored server promoted", func() bool {
		var recovering bool
		return restoredAdmin.Get(&recovering, `SELECT pg_is_in_recovery()`) == nil && !recovering
	})
	e.useAddr(restored.addr())
	lost := e.missing(load)
	t.Logf("restored to %s: the database lacks %d of the %d events of the load, all acked", target, lost, len(load))
	if lost == 0 || lost == len(load) {
		t.Fatalf("the restore's target is not under the load (%d of %d lost)", lost, len(load))
	}

	proc = startProcess(t, e.serviceEnv(2, append(env, "DATABASE_URL="+failoverURL(false, e.name, restored))...))
	// No event comes until the lost ones are back: the service restores
	// them when it starts, not at a queue's next event.
	waitFor(t, 120*time.Second, "the lost events applied again before any new event", func() bool {
		return e.inboxCount() == len(before)+len(load)
	})
	// All of them in the one read of the stream the service makes at start,
	// which says so once it is over.
	waitFor(t, 60*time.Second, "the start's read of the journal over", func() bool { return proc.field(journalPrimed, "queues") != "" })
	if n := proc.sum(journalPrimed, "entries_applied_again"); n < lost {
		t.Errorf("the start's read of the journal applied %d entries again, want at least the %d lost", n, lost)
	}
	more := transfers(e, 100, 8)
	if err := e.publishPipelined(more, &published); err != nil {
		t.Fatal(err)
	}
	e.checkRestored(proc, append(append(before, load...), more...), lost)
}

// declareStream declares the journal's stream with args (beside its
// type) on a connection of its own, closed when the test ends, and
// returns the channel it declared it on.
func (e *env) declareStream(stream string, args amqp.Table) *amqp.Channel {
	e.t.Helper()
	conn, err := amqp.Dial(e.amqpURL)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		e.t.Fatal(err)
	}
	all := amqp.Table{"x-queue-type": "stream"}
	for k, v := range args {
		all[k] = v
	}
	if _, err := ch.QueueDeclare(stream, true, false, false, false, all); err != nil {
		e.t.Fatal(err)
	}
	return ch
}

// firstJournalEntry returns the sequence of the first entry the stream
// holds, as its first message's header says, or 0 when it holds none.
func firstJournalEntry(t *testing.T, ch *amqp.Channel, stream string) int64 {
	t.Helper()
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	tag := "first-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	deliveries, err := ch.Consume(stream, tag, false, false, false, false, amqp.Table{"x-stream-offset": "first"})
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Cancel(tag, false)
	select {
	case d := <-deliveries:
		_ = d.Ack(false)
		first, _ := d.Headers["x-journal-first"].(int64)
		if several, ok := d.Headers["x-journal-queues"].(string); ok {
			// Several queues' entries: the lowest first of them.
			var ranges map[string][2]int64
			_ = json.Unmarshal([]byte(several), &ranges)
			for _, r := range ranges {
				if first == 0 || r[0] < first {
					first = r[0]
				}
			}
		}
		return first
	case <-time.After(5 * time.Second):
		return 0
	}
}

// journalPrimed is what the service logs once it compared every queue with
// the journal at start.
const journalPrimed = "journal: compared every queue with the database in one read of the stream"

// journalCheckFailed is what the service logs when it could not compare a
// queue's journal with the database, or the journal does not reach back.
const journalCheckFailed = "journal: could not compare the queue's journal with the database; its next event, or the next check, tries again"

// missing counts the events of evs the database lacks.
func (e *env) missing(evs []transfer) int {
	e.t.Helper()
	n := 0
	for _, ev := range evs {
		if e.inboxRows(ev.EventID) == 0 {
			n++
		}
	}
	return n
}

// checkRestored waits until every event of events is applied, stops proc,
// and checks that each was applied once, each account in order, none
// dead-lettered, and that proc says it applied again at least the lost
// ones from the journal (the count may include entries the database still
// held, which the inbox dropped).
func (e *env) checkRestored(proc *process, events []transfer, lost int) {
	e.t.Helper()
	waitFor(e.t, 120*time.Second, "every event applied", func() bool { return e.inboxCount() == len(events) })
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		e.t.Errorf("exit after SIGTERM: %v", err)
	}
	e.checkExactlyOnce(events)
	e.checkAccountOrder(events)
	if n := proc.count("outcome", "dead_lettered"); n != 0 {
		e.t.Errorf("%d events dead-lettered", n)
	}
	if restored := proc.sum("journal: applied again the entries the database had lost", "entries"); restored < lost {
		e.t.Errorf("the service says it applied %d entries again, want at least the %d lost", restored, lost)
	}
}

// journaled reads the whole journal stream through one of amqpURLs, up
// to a fence it appends, and returns the ids of the events its entries
// hold (those not dead-lettered), and letterKey of the routing key of each
// dead letter parked during an alarm. A node started again may not run its
// replica of the stream yet: it tries the next, until one answers.
func (e *env) journaled(amqpURLs []string, stream string) map[string]bool {
	e.t.Helper()
	var out map[string]bool
	var last error
	waitFor(e.t, 60*time.Second, "the journal read whole", func() bool {
		for _, u := range amqpURLs {
			if out, last = readJournal(u, stream); last == nil {
				return true
			}
		}
		return false
	})
	if out == nil {
		e.t.Fatalf("the journal could not be read: %v", last)
	}
	return out
}

func readJournal(amqpURL, stream string) (map[string]bool, error) {
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	fence := "fence-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	c, err := ch.PublishWithDeferredConfirm("", stream, false, false, amqp.Publishing{Headers: amqp.Table{"x-journal-fence": fence}})
	if err != nil {
		return nil, err
	}
	if !c.Wait() {
		return nil, fmt.Errorf("the fence was not confirmed")
	}
	if err := ch.Qos(100, 0, false); err != nil {
		return nil, err
	}
	deliveries, err := ch.Consume(stream, "", false, false, false, false, amqp.Table{"x-stream-offset": "first"})
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	deadline := time.After(60 * time.Second)
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return nil, fmt.Errorf("the read ended before its fence")
			}
			_ = d.Ack(false)
			if f, _ := d.Headers["x-journal-fence"].(string); f == fence {
				return out, nil
			}
			body := d.Body
			if _, several := d.Headers["x-journal-queues"]; several {
				// Several queues' entries: [{"q": queue, "e": entries}, …].
				var parts []struct {
					E json.RawMessage `json:"e"`
				}
				if err := json.Unmarshal(d.Body, &parts); err != nil {
					return nil, fmt.Errorf("a journal message: %w", err)
				}
				body = []byte{'['}
				for i, p := range parts {
					if i > 0 {
						body = append(body, ',')
					}
					body = append(body, bytes.TrimSuffix(bytes.TrimPrefix(bytes.TrimSpace(p.E), []byte("[")), []byte("]"))...)
				}
				body = append(body, ']')
			} else if _, ok := d.Headers["x-journal-queue"]; !ok {
				continue
			}
			var entries []struct {
				Dead       bool      `json:"deadLettered"`
				Letter     *struct{} `json:"letter"`
				RoutingKey string    `json:"routingKey"`
				Body       struct {
					EventID string `json:"eventId"`
				} `json:"body"`
			}
			if err := json.Unmarshal(body, &entries); err != nil {
				return nil, fmt.Errorf("a journal message: %w", err)
			}
			for _, en := range entries {
				switch {
				case en.Letter != nil: // a dead letter parked during an alarm
					out[letterKey(en.RoutingKey)] = true
				case !en.Dead:
					out[en.Body.EventID] = true
				}
			}
		case <-deadline:
			return nil, fmt.Errorf("the fence did not come back within a minute")
		}
	}
}

// letterKey is how journaled names the entry of a dead letter parked
// during an alarm: by its routing key.
func letterKey(routingKey string) string { return "letter " + routingKey }
