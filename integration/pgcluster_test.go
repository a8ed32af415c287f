package integration

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
)

// pgCluster is a PostgreSQL server of a test's own, for faults that would
// disturb the server other tests share: stopping it, or a standby to fail
// over to. It needs PostgreSQL's server programs (TEST_PG_BINDIR, else
// pg_config --bindir); without them the test skips, except with CI=true.
type pgCluster struct {
	t    *testing.T
	bin  string // the server programs' directory
	dir  string // data directory
	port int
	// synced: the server syncs its files (fsync on), as an estate's does;
	// otherwise it runs with fsync off, which the tests' servers can
	// afford and which saves the disk's flushes.
	synced bool
}

// syncedSetting, among newPGCluster's settings, keeps fsync on.
const syncedSetting = "fsync = on"

// newPGCluster initialises and starts a server on a free port of its own,
// with settings ("name = value") added to its postgresql.conf; fsync is
// off unless they hold syncedSetting.
func newPGCluster(t *testing.T, settings ...string) *pgCluster {
	t.Helper()
	c := &pgCluster{t: t, bin: pgBinDir(t), port: freePort(t), synced: slices.Contains(settings, syncedSetting)}
	c.dir = pgDataDir(t)
	c.run("initdb", "-D", c.dir, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync")
	if len(settings) > 0 {
		f, err := os.OpenFile(filepath.Join(c.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(f, strings.Join(settings, "\n"))
		f.Close()
	}
	c.start()
	return c
}

// standby makes a streaming standby of c on a port of its own and starts it.
func (c *pgCluster) standby() *pgCluster {
	c.t.Helper()
	s := &pgCluster{t: c.t, bin: c.bin, port: freePort(c.t)}
	s.dir = pgDataDir(c.t)
	s.run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(c.port), "-U", "postgres",
		"-D", s.dir, "-R", "-X", "stream", "-c", "fast", "--no-sync")
	s.start()
	return s
}

func (c *pgCluster) start() {
	c.t.Helper()
	options := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -k %s", c.port, c.dir)
	if !c.synced {
		options += " -c fsync=off"
	}
	c.run("pg_ctl", "-D", c.dir, "-l", filepath.Join(c.dir, "server.log"), "-w", "-t", "60", "-o", options, "start")
	c.t.Cleanup(c.stopQuietly)
}

// stop stops the server as a DBA does for maintenance (fast: sessions are
// terminated, nothing committed is lost).
func (c *pgCluster) stop() {
	c.t.Helper()
	c.run("pg_ctl", "-D", c.dir, "-m", "fast", "-w", "stop")
}

func (c *pgCluster) stopQuietly() {
	_ = c.command("pg_ctl", "-D", c.dir, "-m", "immediate", "-w", "stop").Run()
}

// addr is the server's host:port.
func (c *pgCluster) addr() string { return fmt.Sprintf("127.0.0.1:%d", c.port) }

// adminURL is a URL to its maintenance database as the superuser.
func (c *pgCluster) adminURL() string {
	return fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", c.addr())
}

func (c *pgCluster) run(program string, args ...string) {
	c.t.Helper()
	if out, err := c.command(program, args...).CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
		c.t.Fatalf("%s %s: %v\n%s\n%s", program, strings.Join(args, " "), err, out, log)
	}
}

// command runs one of the server programs, as the postgres user when the
// tests run as root (the server refuses to run as root).
func (c *pgCluster) command(program string, args ...string) *exec.Cmd {
	path := filepath.Join(c.bin, program)
	if os.Geteuid() == 0 {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}

func pgBinDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("TEST_PG_BINDIR")
	if dir == "" {
		if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
			dir = strings.TrimSpace(string(out))
		}
	}
	_, err := os.Stat(filepath.Join(dir, "initdb"))
	if dir == "" || err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true but PostgreSQL's server programs are not here (TEST_PG_BINDIR or pg_config --bindir): %v", err)
		}
		t.Skip("needs PostgreSQL's server programs (initdb, pg_ctl)")
	}
	return dir
}

// pgDataDir makes an empty directory the server may own: the postgres
// user's when the tests run as root.
func pgDataDir(t *testing.T) string {
	t.Helper()
	parent, err := os.MkdirTemp("", "transferconsumer-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "data")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, but there is no postgres user to run the server: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// copyDir copies a stopped server's data directory into an empty one the
// server may own, keeping owners and modes.
func copyDir(t *testing.T, from, to string) {
	t.Helper()
	if out, err := exec.Command("cp", "-a", from+"/.", to).CombinedOutput(); err != nil {
		t.Fatalf("cp -a %s %s: %v\n%s", from, to, err, out)
	}
}

// conf appends settings to the server's postgresql.auto.conf; they take
// effect at its next start.
func (c *pgCluster) conf(settings string) {
	c.t.Helper()
	f, err := os.OpenFile(filepath.Join(c.dir, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(settings); err != nil {
		c.t.Fatal(err)
	}
}

// basebackup takes a pg_basebackup of the running server into a new
// directory and returns it; startable, it is made ready to be started as
// it is, in place of the server (its socket lock files removed).
func (c *pgCluster) basebackup(startable bool) string {
	c.t.Helper()
	dir := pgDataDir(c.t)
	c.run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(c.port), "-U", "postgres",
		"-D", dir, "-X", "stream", "-c", "fast", "--no-sync")
	if startable {
		removeSocketLocks(c.t, dir)
	}
	return dir
}

// openAdmin opens the server's maintenance database, closed when the test
// ends.
func (c *pgCluster) openAdmin() *sqlx.DB { return c.openDB("postgres") }

// openDB opens one of the server's databases, closed when the test ends.
func (c *pgCluster) openDB(name string) *sqlx.DB {
	c.t.Helper()
	d, err := sqlx.Open("postgres", fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", c.addr(), name))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { d.Close() })
	return d
}
