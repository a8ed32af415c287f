package integration

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"transferconsumer/db"
	"transferconsumer/event"
	"transferconsumer/journal"
)

// vouchedLane is the database's lane of a queue with the journal: the
// moves of its mark, and the database's word about it.
type vouchedLane interface {
	event.MarkedLane
	journal.Voucher
}

// The database vouches for a queue's journal mark only in the run of the
// server that wrote it (adr/0014, "What is trusted"), and each restore
// that puts the server's files back starts another run. Done for real on
// a server of the test's own: a read vouches for the mark, another
// replica moves it on (those events journaled and acked), and then
//   - the server restarts, losing nothing: the mark is no longer vouched
//     for, and a move from it fails until a read vouches again;
//   - a cold copy of the data directory, taken at 4, is put back after
//     the mark moved to 8: the database holds 4, on the same cluster,
//     timeline and table file as before, and must not vouch for it;
//   - a pg_basebackup taken at 8 is started as it is (crash recovery
//     only, no recovery.signal) after the mark moved to 12: the same.
//
// On the code before (the cluster, database, table file and timeline
// recorded on the row), the move from the restored mark went through, and
// the sequences the journal held for acked events were taken again: with
// the stream unreadable, a start lost them for good. (Named TestFailoverTo…
// so that the 4.x passes leave it to the 3.10 pass: it needs no broker.)
func TestFailoverToARestoredCopyMovesNoMarkUntilAReadVouchedForIt(t *testing.T) {
	parallel(t)
	server := newPGCluster(t, syncedSetting) // as an estate's: the vouch's hole hid behind fsync off
	e := newEnvOn(t, server.adminURL())
	queue := e.name + ".0"
	var l vouchedLane
	reconnect := func() {
		t.Helper()
		e.useAddr(server.addr())
		l = db.NewInbox(e.db).Lane(0).(vouchedLane)
		t.Cleanup(l.Close)
	}
	move := func(prev, last int64) error {
		_, err := l.ApplyMarked(t.Context(), nil, event.Mark{Queue: queue, Prev: prev, Last: last})
		return err
	}
	mustMove := func(prev, last int64) {
		t.Helper()
		if err := move(prev, last); err != nil {
			t.Fatalf("move %d to %d: %v", prev, last, err)
		}
	}
	vouch := func(mark int64) {
		t.Helper()
		if err := l.Vouch(t.Context(), queue, mark, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	// refused checks that the database, back at mark after what, neither
	// vouches for it nor lets a transaction move it, until a read vouches.
	refused := func(what string, mark int64) {
		t.Helper()
		got, why, err := l.Vouched(t.Context(), queue)
		if err != nil || got != mark || !strings.Contains(why, "started again") {
			t.Fatalf("after %s: mark %d, %q (%v); want %d, and that the server started again", what, got, why, err, mark)
		}
		if err := move(mark, mark+1); !errors.Is(err, event.ErrJournalGap) {
			t.Fatalf("after %s, a move from the mark the database holds: %v; want ErrJournalGap, so that the lane reads the journal first", what, err)
		}
		vouch(mark) // the read: it restores what the journal holds above mark, then vouches
		if got, why, err := l.Vouched(t.Context(), queue); err != nil || got != mark || why != "" {
			t.Fatalf("after %s, vouched for again: mark %d, %q (%v)", what, got, why, err)
		}
	}

	reconnect()
	vouch(0)
	mustMove(0, 3)
	server.stop()
	server.start()
	reconnect()
	refused("a restart", 3)
	mustMove(3, 4)

	// A cold copy, taken at 4, put back after the mark moved to 8.
	server.stop()
	cold := pgDataDir(t)
	copyDir(t, server.dir, cold)
	server.start()
	reconnect()
	vouch(4)
	mustMove(4, 8)
	server.stop()
	server.dir = cold
	server.start()
	reconnect()
	refused("a cold copy put back", 4)
	mustMove(4, 8)

	// A pg_basebackup at 8, started as it is, after the mark moved to 12.
	backup := pgDataDir(t)
	server.run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(server.port), "-U", "postgres",
		"-D", backup, "-X", "stream", "-c", "fast", "--no-sync")
	mustMove(8, 12)
	server.stop()
	removeSocketLocks(t, backup)
	server.dir = backup
	server.start()
	reconnect()
	refused("a pg_basebackup started as it is", 8)
}

// removeSocketLocks removes what a pg_basebackup copies of the server's
// socket lock files (the tests' servers keep their sockets in their data
// directories), which would keep a server started from the copy from
// opening its own socket.
func removeSocketLocks(t *testing.T, dir string) {
	t.Helper()
	locks, err := filepath.Glob(filepath.Join(dir, ".s.PGSQL.*.lock"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range locks {
		if err := os.Remove(l); err != nil {
			t.Fatal(err)
		}
	}
}

// A role that may not read the cluster's identifier nor the WAL's
// position (what a DBA revokes from PUBLIC in some estates) gets the same
// answer from the check a start asks (Vouched) as from the one every
// transaction meets (journal_advance), before a restart and after it: the
// check reads nothing such a role may not. On the code before, the two
// disagreed for such a role: journal_vouched_here compared NULL with NULL
// and let the mark move, while Vouched refused it. (Named TestFailoverTo…
// so that the 4.x passes leave it to the 3.10 pass.)
func TestFailoverToARestartedServerAsARoleWithoutPrivilegesAgrees(t *testing.T) {
	parallel(t)
	server := newPGCluster(t)
	admin := server.openAdmin()
	for _, fn := range []string{"pg_control_system()", "pg_walfile_name(pg_lsn)", "pg_current_wal_lsn()"} {
		admin.MustExec(`REVOKE EXECUTE ON FUNCTION ` + fn + ` FROM PUBLIC`)
	}
	e := newEnvOn(t, server.adminURL())
	e.db.MustExec(`CREATE ROLE plain LOGIN`)
	if err := db.Grant(t.Context(), e.db, "plain"); err != nil {
		t.Fatal(err)
	}
	queue := e.name + ".0"
	var l vouchedLane
	connect := func() {
		t.Helper()
		d, err := db.Open(t.Context(), "postgres://plain@"+server.addr()+"/"+e.name+"?sslmode=disable", 2)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		l = db.NewInbox(d).Lane(0).(vouchedLane)
		t.Cleanup(l.Close)
	}
	// agree checks that Vouched says "" exactly when a move from mark goes
	// through, and returns whether it did.
	agree := func(what string, mark int64) bool {
		t.Helper()
		got, why, err := l.Vouched(t.Context(), queue)
		if err != nil || got != mark {
			t.Fatalf("%s: Vouched: mark %d (%v), want %d", what, got, err, mark)
		}
		_, err = l.ApplyMarked(t.Context(), nil, event.Mark{Queue: queue, Prev: mark, Last: mark + 1})
		if err != nil && !errors.Is(err, event.ErrJournalGap) {
			t.Fatalf("%s: a move from %d: %v", what, mark, err)
		}
		if (why == "") != (err == nil) {
			t.Errorf("%s: Vouched says %q, and a move from the mark %v: the two checks disagree", what, why, err)
		}
		return err == nil
	}
	connect()
	if err := l.Vouch(t.Context(), queue, 0, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !agree("vouched for, as a role without privileges", 0) {
		t.Fatal("a mark a read vouched for could not move")
	}
	server.stop()
	server.start()
	connect()
	if agree("after a restart", 1) {
		t.Error("after a restart, a move from the mark went through without a read")
	}
}
