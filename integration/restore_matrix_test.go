package integration

import (
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
)

// Every restore an operator does, done for real, with the journal on
// (adr/0014, "What is trusted"; adr/0007, "After a restore"): events are
// applied and acked, a periodic reconciliation passes, a restore point is
// taken, more events are applied and acked, and the service stops; the
// database is then put back as the kind of restore does it, and the
// service started on it, normally, while the journal's stream cannot be
// read, or during a memory alarm (TestEveryRestoreWithTheJournalStartedDuringAnAlarm).
// In every case nothing acked is lost and nothing is applied twice, no
// event is dead-lettered, and every periodic reconciliation pass after
// the restore exits 0. Started while the stream cannot be read, each
// queue waits, its event in hand and the queue reported blocked, until it
// can be read: the restored database cannot vouch for what it lost.
//
// The servers sync their files (fsync on), as an estate's do. On the code
// before, the cold copy and the pg_basebackup started while the stream
// could not be read went on from the restored marks (the same cluster,
// database, table file and timeline vouched for them): 'the database
// holds 93 events, want the 60 it held after the restore', and the 150
// events acked after the restore point were lost for good ('timed out
// after 2m0s waiting for every event applied'). And after the dump into a
// cluster made anew, and the switch to a logical replica, every periodic
// pass after the first reported accounts in drift ('the periodic
// reconciliation once more: exit 3').
func TestEveryRestoreWithTheJournal(t *testing.T) {
	parallel(t) // each on servers of its own
	for _, kind := range restoreKinds {
		for _, start := range []string{"started normally", "started while the stream cannot be read"} {
			t.Run(kind.name+", "+start, func(t *testing.T) {
				t.Parallel()
				runRestore(t, kind, start, nil)
			})
		}
	}
}

// TestEveryRestoreWithTheJournal's restores, the service started during a
// memory alarm, with the events published after the restore queued before
// it: a fresh connection's first publish (the start's fence) gets through
// an alarm, so the start reads the journal and restores what was lost,
// and the backlog is applied while the alarm lasts. The restores run side
// by side, as many at once as -parallel lets run, and one alarm covers
// each such group: raised once each is ready to start its service,
// cleared once each applied its backlog during it.
func TestEveryRestoreWithTheJournalStartedDuringAnAlarm(t *testing.T) {
	ctl := rabbitmqctl(t)
	parallel := flag.Lookup("test.parallel").Value.(flag.Getter).Get().(int)
	groups := (len(restoreKinds) + parallel - 1) / parallel
	size := (len(restoreKinds) + groups - 1) / groups // as even as -parallel lets them be
	for g, kinds := 1, restoreKinds; len(kinds) > 0; g++ {
		n := min(size, len(kinds))
		a := newSharedAlarm(ctl, n)
		t.Run(fmt.Sprintf("alarm %d", g), func(t *testing.T) {
			for _, kind := range kinds[:n] {
				t.Run(kind.name, func(t *testing.T) {
					t.Parallel()
					runRestore(t, kind, "started during a memory alarm", a)
				})
			}
		})
		kinds = kinds[n:]
	}
}

// sharedAlarm is the one memory alarm of a group of restores started
// during it: the last of them ready to start raises it, and clears it
// once every one applied its backlog; each waits for the others between.
// A restore that ends before both lets the others go on (abandon), and
// they then find no alarm: the group fails, and none waits for ever.
type sharedAlarm struct {
	ctl                         brokerCtl
	mu                          sync.Mutex
	toPrepare, toApply          int
	raise, all, end             sync.Once
	raised, allApplied, cleared chan struct{}
}

func newSharedAlarm(ctl brokerCtl, n int) *sharedAlarm {
	return &sharedAlarm{ctl: ctl, toPrepare: n, toApply: n,
		raised: make(chan struct{}), allApplied: make(chan struct{}), cleared: make(chan struct{})}
}

// prepared says that t's restore is ready to start its service, and
// returns once the alarm is on, and whether t raised it: the last ready
// does, and clears it too.
func (a *sharedAlarm) prepared(t *testing.T) (raiser bool) {
	a.mu.Lock()
	a.toPrepare--
	raiser = a.toPrepare == 0
	a.mu.Unlock()
	if raiser {
		clear := setMemoryAlarm(t, a.ctl)
		t.Cleanup(func() { // once every restore of the group applied its backlog
			<-a.allApplied
			clear()
			a.end.Do(func() { close(a.cleared) })
		})
		a.raise.Do(func() { close(a.raised) })
	}
	<-a.raised
	return raiser
}

// applied says that a restore applied its backlog during the alarm; a
// restore that did not raise the alarm waits until it is cleared.
func (a *sharedAlarm) applied(raiser bool) {
	a.mu.Lock()
	a.toApply--
	if a.toApply == 0 {
		a.all.Do(func() { close(a.allApplied) })
	}
	a.mu.Unlock()
	if !raiser {
		<-a.cleared
	}
}

// abandon lets the other restores of the group go on, one having ended
// before it applied its backlog.
func (a *sharedAlarm) abandon() {
	a.raise.Do(func() { close(a.raised) })
	a.all.Do(func() { close(a.allApplied) })
	a.end.Do(func() { close(a.cleared) })
}

// restoreKind is a way to put a database back or move it (shared/notes
// postgres.md, "Restores, and what each keeps").
type restoreKind struct {
	name string
	// loses: the restore point is before the load, whose events the
	// restored database lacks (a logical move loses nothing).
	loses bool
	// setUp prepares the server before the service starts on it.
	setUp func(r *restoreRun)
	// point takes the restore point, the service running.
	point func(r *restoreRun)
	// restore puts the database back, the service stopped, and returns
	// the server that holds it now.
	restore func(r *restoreRun) *pgCluster
}

// restoreRun is one run of a restore: the server the service uses, and
// what the kind keeps between its steps.
type restoreRun struct {
	t       *testing.T
	e       *env
	server  *pgCluster
	admin   *sqlx.DB // the server's maintenance database
	dir     string   // a copy, a backup, or a dump's directory
	target  string   // a point-in-time restore's target
	archive string   // its WAL archive
	other   *pgCluster
}

var restoreKinds = []restoreKind{
	{
		name: "point-in-time", loses: true,
		setUp: func(r *restoreRun) {
			r.archive = pgDataDir(r.t)
			r.server.conf(fmt.Sprintf("archive_mode = on\narchive_command = 'cp %%p %s/%%f'\n", r.archive))
			r.server.stop()
			r.server.start()
		},
		point: func(r *restoreRun) {
			r.dir = r.server.basebackup(false)
			r.admin.Get(&r.target, `SELECT now()::text`)
		},
		restore: func(r *restoreRun) *pgCluster {
			var segment string
			r.admin.Get(&segment, `SELECT pg_walfile_name(pg_switch_wal())`)
			waitFor(r.t, 60*time.Second, "the WAL archived up to the end of the load", func() bool {
				var archived string
				r.admin.Get(&archived, `SELECT coalesce(last_archived_wal, '') FROM pg_stat_archiver`)
				return archived >= segment
			})
			r.server.stopQuietly()
			restored := &pgCluster{t: r.t, bin: r.server.bin, dir: r.dir, port: freePort(r.t), synced: true}
			restored.conf(fmt.Sprintf("archive_mode = off\nrestore_command = 'cp %s/%%f %%p'\nrecovery_target_time = '%s'\n"+
				"recovery_target_action = 'promote'\n", r.archive, r.target))
			if err := os.WriteFile(filepath.Join(r.dir, "recovery.signal"), nil, 0o644); err != nil {
				r.t.Fatal(err)
			}
			restored.start()
			admin := restored.openAdmin()
			waitFor(r.t, 120*time.Second, "the restored server promoted", func() bool {
				var recovering bool
				return admin.Get(&recovering, `SELECT pg_is_in_recovery()`) == nil && !recovering
			})
			return restored
		},
	},
	{
		name: "a cold copy of the data directory put back", loses: true,
		point: func(r *restoreRun) {
			r.server.stop()
			r.dir = pgDataDir(r.t)
			copyDir(r.t, r.server.dir, r.dir)
			r.server.start()
		},
		restore: func(r *restoreRun) *pgCluster {
			r.server.stop()
			r.server.dir = r.dir
			r.server.start()
			return r.server
		},
	},
	{
		name: "a pg_basebackup started as it is", loses: true,
		point: func(r *restoreRun) { r.dir = r.server.basebackup(true) },
		restore: func(r *restoreRun) *pgCluster {
			r.server.stop()
			r.server.dir = r.dir
			r.server.start()
			return r.server
		},
	},
	{
		name: "pg_dump into a cluster made anew", loses: true, setUp: aged,
		point: func(r *restoreRun) {
			r.dir = pgDataDir(r.t)
			r.server.run("pg_dump", "-h", "127.0.0.1", "-p", strconv.Itoa(r.server.port), "-U", "postgres", "-Fc",
				"-f", filepath.Join(r.dir, "dump"), r.e.name)
		},
		restore: func(r *restoreRun) *pgCluster {
			r.server.stop()
			fresh := newPGCluster(r.t, syncedSetting)
			fresh.run("createdb", "-h", "127.0.0.1", "-p", strconv.Itoa(fresh.port), "-U", "postgres", r.e.name)
			fresh.run("pg_restore", "-h", "127.0.0.1", "-p", strconv.Itoa(fresh.port), "-U", "postgres", "-d", r.e.name,
				filepath.Join(r.dir, "dump"))
			return fresh
		},
	},
	{
		name: "logical replication into a cluster made anew, then a switch",
		setUp: func(r *restoreRun) {
			aged(r)
			r.server.conf("wal_level = logical\n")
			r.server.stop()
			r.server.start()
		},
		point: func(r *restoreRun) {
			// The subscriber: the schema, then every table's rows as
			// they are and as they change.
			r.other = newPGCluster(r.t, syncedSetting)
			r.dir = pgDataDir(r.t)
			schema := filepath.Join(r.dir, "schema")
			r.server.run("pg_dump", "-h", "127.0.0.1", "-p", strconv.Itoa(r.server.port), "-U", "postgres", "-Fc",
				"--schema-only", "-f", schema, r.e.name)
			r.other.run("createdb", "-h", "127.0.0.1", "-p", strconv.Itoa(r.other.port), "-U", "postgres", r.e.name)
			r.other.run("pg_restore", "-h", "127.0.0.1", "-p", strconv.Itoa(r.other.port), "-U", "postgres", "-d", r.e.name, schema)
			r.e.db.MustExec(`CREATE PUBLICATION everything FOR ALL TABLES`)
			sub := r.other.openDB(r.e.name)
			sub.MustExec(fmt.Sprintf(`CREATE SUBSCRIPTION everything CONNECTION 'host=127.0.0.1 port=%d dbname=%s user=postgres' PUBLICATION everything`,
				r.server.port, r.e.name))
		},
		restore: func(r *restoreRun) *pgCluster {
			// Writes stopped (the service is), the subscriber caught up,
			// the subscription dropped, and the service moved to it.
			// Then the sequences, which logical replication does not copy.
			sub := r.other.openDB(r.e.name)
			var lsn string
			r.e.db.Get(&lsn, `SELECT pg_current_wal_lsn()::text`)
			waitFor(r.t, 60*time.Second, "the subscriber caught up", func() bool {
				var synced, flushed bool
				return sub.Get(&synced, `SELECT bool_and(srsubstate = 'r') FROM pg_subscription_rel`) == nil && synced &&
					r.admin.Get(&flushed, `SELECT coalesce(bool_and(confirmed_flush_lsn >= $1::pg_lsn), false)
						FROM pg_replication_slots WHERE slot_name = 'everything'`, lsn) == nil && flushed
			})
			sub.MustExec(`DROP SUBSCRIPTION everything`)
			var seqs []struct {
				Name string `db:"name"`
				Last *int64 `db:"last_value"`
			}
			if err := r.e.db.Select(&seqs, `SELECT format('%I.%I', schemaname, sequencename) AS name, last_value FROM pg_sequences`); err != nil {
				r.t.Fatal(err)
			}
			for _, q := range seqs {
				if q.Last != nil {
					sub.MustExec(`SELECT setval($1, $2)`, q.Name, *q.Last)
				}
			}
			return r.other
		},
	},
}

// aged moves the server's transaction ids on by 10,000, as a cluster in
// use for a while has: a cluster made anew starts near 750, so the rows
// moved there carry ids it has not reached, as after any move of a real
// database. (Without it, the service's own transactions in the new
// cluster soon pass the old ids, and a reconciliation that misreads them
// goes unseen.)
func aged(r *restoreRun) {
	r.admin.MustExec(`DO $$ BEGIN FOR i IN 1 .. 10000 LOOP
		PERFORM set_config('synchronous_commit', 'off', true), pg_current_xact_id(); COMMIT;
	END LOOP; END $$`)
}

// runRestore runs one restore of kind, the service started after it as
// start says.
func runRestore(t *testing.T, kind restoreKind, start string, alarm *sharedAlarm) {
	reached := false // the alarm's last step, for a restore started during it
	if alarm != nil {
		defer func() {
			if !reached {
				alarm.abandon()
			}
		}()
	}
	r := &restoreRun{t: t, server: newPGCluster(t, syncedSetting)} // as an estate's: the vouch's hole hid behind fsync off
	r.admin = r.server.openAdmin()
	if kind.setUp != nil {
		kind.setUp(r)
	}
	e := newEnvOn(t, r.server.adminURL())
	r.e = e
	e.declare(2)
	e.recordApplyOrder()
	stream := prefix + ".journal"
	env := func(server *pgCluster) []string {
		return e.serviceEnv(2, "INSTANCE_NAME="+e.name+"-svc", "APPLY_TIMEOUT=5s", "JOURNAL_STREAM="+stream,
			"DATABASE_URL="+failoverURL(false, e.name, server))
	}
	periodic := func(when string) {
		t.Helper()
		dbURL := fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", r.server.addr(), e.name)
		if r, code := reconcileOn(t, dbURL, "--periodic"); code != 0 {
			t.Errorf("the periodic reconciliation %s: exit %d, %v; want 0", when, code, r)
		}
	}

	proc := startProcess(t, env(r.server))
	proc.waitConsuming(1)
	var published atomic.Int64
	before := distinctTransfers(e, 60, 0)
	if err := e.publishPipelined(before, &published); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the first events applied", func() bool { return e.inboxCount() == len(before) })
	periodic("before the restore point")
	kind.point(r)
	load := distinctTransfers(e, 150, 1000)
	if err := e.publishPipelined(load, &published); err != nil {
		t.Fatal(err)
	}
	all := append(before, load...)
	waitFor(t, 90*time.Second, "the load applied and acked", func() bool {
		return e.inboxCount() == len(all) && e.ready(prefix+".0")+e.ready(prefix+".1") == 0 &&
			proc.count("outcome", "applied") == len(all)
	})
	periodic("after the load")
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}

	r.server = kind.restore(r)
	e.useAddr(r.server.addr())
	lost := e.missing(load)
	t.Logf("%s: the database lacks %d of the %d events of the load, all acked", kind.name, lost, len(load))
	want := 0 // a logical move loses nothing
	if kind.loses {
		want = len(load) // the restore point is before the load
	}
	if lost != want {
		t.Fatalf("the restored database lacks %d of the load, want %d", lost, want)
	}

	after := distinctTransfers(e, 40, 2000)
	switch start {
	case "started normally":
		proc = startProcess(t, env(r.server))
		waitFor(t, 120*time.Second, "the lost events applied again at start", func() bool { return e.inboxCount() == len(all) })
		if err := e.publishPipelined(after, &published); err != nil {
			t.Fatal(err)
		}
	case "started while the stream cannot be read":
		perms := "/api/permissions/" + url.PathEscape(e.vhost) + "/" + url.PathEscape(e.b.adminUser())
		grant := func(read string) {
			e.b.mgmt(t, http.MethodPut, perms, map[string]string{"configure": ".*", "write": ".*", "read": read}, nil)
		}
		grant(`^(?!` + regexp.QuoteMeta(stream) + `$).*`) // every queue but the stream
		t.Cleanup(func() { grant(".*") })
		proc = startProcess(t, env(r.server))
		if err := e.publishPipelined(after, &published); err != nil {
			t.Fatal(err)
		}
		base := proc.httpAddr()
		waitFor(t, 60*time.Second, "both queues reported blocked by the unreadable journal, or an event applied", func() bool {
			return len(blockedByJournal(t, base)) == 2 || e.inboxCount() > len(all)-lost
		})
		held := e.inboxCount()
		t.Logf("while the stream cannot be read: %d events in the database, %d before the restore point; blocked: %v",
			held, len(all)-lost, blockedByJournal(t, base))
		if held != len(all)-lost {
			t.Errorf("while the stream cannot be read, the database holds %d events, want the %d it held after the restore: "+
				"a queue went on from a mark the database cannot vouch for", held, len(all)-lost)
		}
		grant(".*")
	case "started during a memory alarm":
		if err := e.publishPipelined(after, &published); err != nil {
			t.Fatal(err)
		}
		raiser := alarm.prepared(t)
		proc = startProcess(t, env(r.server))
		waitFor(t, 120*time.Second, "every event applied during the alarm", func() bool {
			return e.inboxCount() == len(all)+len(after)
		})
		if !memoryAlarm(t) {
			t.Fatal("the alarm passed before the test could look: the result proves nothing")
		}
		alarm.applied(raiser)
		reached = true
	}
	e.checkRestored(proc, append(all, after...), lost)
	periodic("after the restore")
	periodic("once more")
}

// blockedByJournal returns the queues /readyz at base reports blocked by
// a journal that cannot be read, with their reasons.
func blockedByJournal(t *testing.T, base string) []string {
	var ready map[string]any
	getJSON(t, base+"/readyz", &ready)
	blocked, _ := ready["blocked_queues"].([]any)
	var out []string
	for _, b := range blocked {
		q, _ := b.(map[string]any)
		if reason := fmt.Sprint(q["reason"], " ", q["error"]); strings.Contains(reason, "journal") {
			out = append(out, fmt.Sprint(q["queue"], ": ", reason))
		}
	}
	return out
}

// distinctTransfers returns n transfers among 8 accounts of e, not yet
// published, each of its own amount (from+1 on): the same payer, payee and
// amount twice within the reconciliation's window is a duplicate intent,
// which a pass reports, and these runs want every pass clean.
func distinctTransfers(e *env, n int, from int64) []transfer {
	out := transfers(e, n, 8)
	for i := range out {
		out[i].Data.AmountMinor = from + int64(i) + 1
	}
	return out
}
