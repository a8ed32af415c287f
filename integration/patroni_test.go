package integration

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// patroniRoot is the Debian forky chroot holding Patroni, etcd and
// PostgreSQL 18, as .ci/patroni installs them (TEST_PATRONI_ROOT, else
// .ci/rabbitmq4's default place). Without it the test skips, except with
// CI=true, where it fails.
func patroniRoot(t *testing.T) string {
	t.Helper()
	root := getenv("TEST_PATRONI_ROOT", "/var/tmp/transferconsumer-rabbitmq43")
	_, err := os.Stat(filepath.Join(root, ".transferconsumer-patroni-ready"))
	switch {
	case err == nil && os.Geteuid() == 0:
		return root
	case os.Getenv("CI") == "true":
		t.Fatalf("CI=true but there is no Patroni chroot in %s (run .ci/patroni up, as root): %v", root, err)
	case err != nil:
		t.Skipf("needs Patroni, etcd and PostgreSQL 18 in a chroot (.ci/patroni up): %v", err)
	default:
		t.Skip("needs root, to run programs in the Patroni chroot")
	}
	return ""
}

// patroniCluster is one etcd member and two PostgreSQL 18 members under
// Patroni in synchronous_mode, all in the chroot, on ports of their own.
type patroniCluster struct {
	t       *testing.T
	root    string // the chroot, on the host
	dir     string // the cluster's directory, inside the chroot
	ids     string // uid:gid of the chroot's postgres user
	etcd    int    // etcd's client port
	members []*patroniMember
}

type patroniMember struct {
	name     string
	pg, rest int // PostgreSQL's and Patroni's REST API's ports
	cmd      *exec.Cmd
	exited   chan struct{}
	stopped  bool
	dataDir  string // inside the chroot
	log      string // Patroni's output, on the host
}

func newPatroniCluster(t *testing.T) *patroniCluster {
	t.Helper()
	root := patroniRoot(t)
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatal(err)
	}
	c := &patroniCluster{t: t, root: root, ids: u.Uid + ":" + u.Gid, etcd: patroniPort(t)}
	hostDir, err := os.MkdirTemp(filepath.Join(root, "tmp"), "tc-patroni-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(hostDir) })
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(hostDir, uid, gid); err != nil {
		t.Fatal(err)
	}
	c.dir = strings.TrimPrefix(hostDir, root)

	peer := patroniPort(t)
	etcd := c.start("etcd", filepath.Join(hostDir, "etcd.log"), "/usr/bin/etcd", "--name", "e1", "--data-dir", c.dir+"/etcd",
		"--listen-client-urls", fmt.Sprintf("http://127.0.0.1:%d", c.etcd),
		"--advertise-client-urls", fmt.Sprintf("http://127.0.0.1:%d", c.etcd),
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peer),
		"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peer),
		"--initial-cluster", fmt.Sprintf("e1=http://127.0.0.1:%d", peer))
	t.Cleanup(func() { etcd.Process.Kill(); etcd.Wait() })

	scope := "tc-" + randomSuffix()
	for i := 1; i <= 2; i++ {
		m := &patroniMember{name: fmt.Sprintf("pg%d", i), pg: patroniPort(t), rest: patroniPort(t)}
		m.dataDir = fmt.Sprintf("%s/%s", c.dir, m.name)
		conf := fmt.Sprintf(patroniConfig, scope, m.name, c.dir+"/"+m.name+"-log", m.rest, m.rest, c.etcd, m.pg, m.pg, m.dataDir, c.dir, c.dir)
		if err := os.Mkdir(filepath.Join(hostDir, m.name+"-log"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(filepath.Join(hostDir, m.name+"-log"), uid, gid); err != nil {
			t.Fatal(err)
		}
		m.log = filepath.Join(hostDir, m.name+"-log", "patroni.log")
		confFile := filepath.Join(hostDir, m.name+".yml")
		if err := os.WriteFile(confFile, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		c.members = append(c.members, m)
		c.startMember(m)
		t.Cleanup(func() { c.stopMember(m) })
		if i == 1 { // the first bootstraps the cluster and leads
			c.waitRole(m, "primary", 120*time.Second)
		}
	}
	c.waitRole(c.members[1], "sync", 120*time.Second)
	return c
}

// patroniConfig is a member's configuration: synchronous_mode, so that
// Patroni names the standby in synchronous_standby_names and promotes only
// it; primary_start_timeout 0, so that a crashed primary fails over at
// once rather than being restarted in place.
const patroniConfig = `scope: %s
name: %s
log:
  dir: %s
  level: INFO
restapi:
  listen: 127.0.0.1:%d
  connect_address: 127.0.0.1:%d
etcd3:
  hosts: 127.0.0.1:%d
bootstrap:
  dcs:
    ttl: 20
    loop_wait: 2
    retry_timeout: 5
    primary_start_timeout: 0
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    postgresql:
      use_pg_rewind: true
      parameters:
        wal_log_hints: "on"
        max_wal_senders: 10
        max_replication_slots: 10
  initdb:
    - encoding: UTF8
    - locale: C
postgresql:
  listen: 127.0.0.1:%d
  connect_address: 127.0.0.1:%d
  data_dir: %s
  bin_dir: /usr/lib/postgresql/18/bin
  pgpass: %s/pgpass
  pg_hba:
    - local all all trust
    - host replication all 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
    rewind:
      username: postgres
  parameters:
    unix_socket_directories: %s
    dynamic_shared_memory_type: mmap
    fsync: "off"
`

// start runs program in the chroot as its postgres user.
func (c *patroniCluster) start(what, logFile, program string, args ...string) *exec.Cmd {
	c.t.Helper()
	cmd := exec.Command("chroot", append([]string{"--userspec=" + c.ids, c.root, "/usr/bin/env", "-i",
		"HOME=" + c.dir, "LANG=C.UTF-8", "PATH=/usr/lib/postgresql/18/bin:/usr/bin:/bin", program}, args...)...)
	out, err := os.Create(logFile)
	if err != nil {
		c.t.Fatal(err)
	}
	defer out.Close() // the child has its own copy
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start %s: %v", what, err)
	}
	return cmd
}

func (c *patroniCluster) startMember(m *patroniMember) {
	m.cmd = c.start("patroni "+m.name, filepath.Join(c.root, c.dir, m.name+".out"), "/usr/bin/patroni", c.dir+"/"+m.name+".yml")
	m.exited = make(chan struct{})
	go func() { m.cmd.Wait(); close(m.exited) }()
}

// stopMember stops Patroni, which stops its PostgreSQL, and makes sure the
// server is gone even if Patroni did not get to it.
func (c *patroniCluster) stopMember(m *patroniMember) {
	if !m.stopped {
		m.stopped = true
		m.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-m.exited:
		case <-time.After(30 * time.Second):
			m.cmd.Process.Kill()
			<-m.exited
		}
	}
	exec.Command("chroot", "--userspec="+c.ids, c.root, "/usr/lib/postgresql/18/bin/pg_ctl",
		"-D", m.dataDir, "-m", "immediate", "-w", "stop").Run()
	if c.t.Failed() {
		for _, f := range []string{m.log, filepath.Join(c.root, c.dir, m.name+".out")} {
			b, _ := os.ReadFile(f)
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			c.t.Logf("patroni %s, the end of %s:\n%s", m.name, filepath.Base(f), b)
		}
	}
}

// role asks m's REST API whether it is in role: "primary" (it leads) or
// "sync" (the synchronous standby).
func (c *patroniCluster) role(m *patroniMember, role string) bool {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/%s", m.rest, role))
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (c *patroniCluster) waitRole(m *patroniMember, role string, timeout time.Duration) {
	c.t.Helper()
	waitFor(c.t, timeout, m.name+" "+role, func() bool { return c.role(m, role) })
}

// leader returns the member that leads now, waiting for one.
func (c *patroniCluster) leader() *patroniMember {
	c.t.Helper()
	var found *patroniMember
	waitFor(c.t, 60*time.Second, "a leader", func() bool {
		for _, m := range c.members {
			if c.role(m, "primary") {
				found = m
				return true
			}
		}
		return false
	})
	return found
}

// switchover asks Patroni to hand the leadership from one member to the
// other, as a DBA does before maintenance.
func (c *patroniCluster) switchover(from, to *patroniMember) {
	c.t.Helper()
	body := fmt.Sprintf(`{"leader": %q, "candidate": %q}`, from.name, to.name)
	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/switchover", from.rest), "application/json", strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		c.t.Fatalf("switchover %s → %s: %s: %s", from.name, to.name, resp.Status, b.String())
	}
}

// crash kills m's PostgreSQL (the postmaster, SIGKILL), leaving its
// Patroni running: with primary_start_timeout 0, the leader fails over.
func (c *patroniCluster) crash(m *patroniMember) {
	c.t.Helper()
	b, err := os.ReadFile(filepath.Join(c.root, m.dataDir, "postmaster.pid"))
	if err != nil {
		c.t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil {
		c.t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		c.t.Fatal(err)
	}
}

var patroniPorts = struct {
	sync.Mutex
	given map[int]bool
}{given: map[int]bool{}}

// patroniPort returns a port below the kernel's range for outgoing
// connections (32768 and up on Linux), free now. The members bind theirs
// only after etcd and a base backup, up to a minute later, and meanwhile
// the service's and the other tests' connections take ports of that range
// by the thousand: one of them could take a port freePort chose.
func patroniPort(t *testing.T) int {
	t.Helper()
	patroniPorts.Lock()
	defer patroniPorts.Unlock()
	for range 100 {
		port := 20000 + rand.IntN(12000)
		if patroniPorts.given[port] {
			continue
		}
		if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			patroniPorts.given[port] = true
			ln.Close()
			return port
		}
	}
	t.Fatal("no free port between 20000 and 32000")
	return 0
}

func (m *patroniMember) addr() string { return fmt.Sprintf("127.0.0.1:%d", m.pg) }

// Under Patroni, two PostgreSQL 18 members in synchronous_mode: while the
// service works through a stream, a switchover, then a failover (the
// leader's PostgreSQL killed). The service follows the leader through the
// URL that names both members with target_session_attrs=read-write, and
// nothing is lost, doubled or dead-lettered; each account keeps its order.
func TestPatroniSwitchoverAndFailoverLoseNothing(t *testing.T) {
	parallel(t) // on servers of its own
	c := newPatroniCluster(t)
	first := c.leader()
	adminURL := fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", first.addr())
	e := newEnvOn(t, adminURL)
	var version int
	e.db.Get(&version, `SELECT current_setting('server_version_num')::int`)
	if version < 180000 {
		t.Fatalf("server_version_num %d, want PostgreSQL 18", version)
	}
	e.declare(4)
	e.recordApplyOrder()
	url := fmt.Sprintf("postgres://postgres@%s,%s/%s?sslmode=disable&target_session_attrs=read-write",
		c.members[0].addr(), c.members[1].addr(), e.name)
	proc := startProcess(t, e.serviceEnv(4, "DATABASE_URL="+url, "APPLY_TIMEOUT=5s"))
	proc.waitConsuming(1)

	var published atomic.Int64
	var all []transfer
	for _, fault := range []string{"switchover", "failover"} {
		leader := c.leader()
		var other *patroniMember
		for _, m := range c.members {
			if m != leader {
				other = m
			}
		}
		c.waitRole(other, "sync", 120*time.Second)
		stream := transfers(e, 1500, 16)
		before := len(all)
		all = append(all, stream...)
		if err := e.publishPipelined(stream, &published); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 60*time.Second, "a fifth of the stream applied before the "+fault, func() bool {
			return e.inboxCount() >= before+len(stream)/5
		})
		if fault == "switchover" {
			c.switchover(leader, other)
		} else {
			c.crash(leader)
		}
		c.waitRole(other, "primary", 120*time.Second)
		e.useAddr(other.addr())
		t.Logf("%s from %s to %s with %d of %d events of the stream applied", fault, leader.name, other.name,
			e.inboxCount()-before, len(stream))
		waitFor(t, 120*time.Second, "every event applied after the "+fault, func() bool { return e.inboxCount() == len(all) })
	}
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	e.checkExactlyOnce(all)
	e.checkAccountOrder(all)
	if n := proc.count("outcome", "dead_lettered"); n != 0 {
		t.Errorf("%d events dead-lettered", n)
	}
}
