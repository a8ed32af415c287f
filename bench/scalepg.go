package main

import (
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// pgSettings are the server settings a scale run holds equal between its
// measurements: the checkpoint's, which decide how often a page's first
// change after a checkpoint writes a full image of it, and the rest an
// estate runs with (autovacuum on).
type pgSettings struct {
	CheckpointTimeout string `json:"checkpoint_timeout"`
	MaxWALSize        string `json:"max_wal_size"`
	WALCompression    string `json:"wal_compression"`
	SharedBuffers     string `json:"shared_buffers"`
	Autovacuum        string `json:"autovacuum"`
	// Kept so that pg_waldump still finds a measured range after a timed
	// checkpoint; it changes neither the WAL written nor when checkpoints run.
	WALKeepSize string `json:"wal_keep_size"`
}

// pgServer is a PostgreSQL server of the benchmark's own, in a temporary
// directory, removed by stop.
type pgServer struct {
	bin, dir, data string
	port           int
	cmd            *exec.Cmd
	cred           *syscall.Credential // the user the server runs as, when the benchmark runs as root
	exited         chan error
	// attached: a server an earlier run left running (-attach), which
	// stop leaves alone.
	attached bool
}

// startPG makes a cluster with initdb from bin (the machine's PostgreSQL
// binaries) under parent, and starts it on a free local port with settings.
// initdb refuses to run as root: as root, the server runs as the user
// postgres.
func startPG(bin, parent string, s pgSettings) (*pgServer, error) {
	return startPGWith(bin, parent, s, nil)
}

// startPGWith is startPG with the server run under wrap (a command and its
// arguments, such as valgrind's), which its backends inherit.
func startPGWith(bin, parent string, s pgSettings, wrap []string) (*pgServer, error) {
	dir, err := os.MkdirTemp(parent, "bench-scale-pg-")
	if err != nil {
		return nil, err
	}
	p := &pgServer{bin: bin, dir: dir, data: filepath.Join(dir, "data")}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root, the server needs the user postgres: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	initdb := p.command("initdb", "-D", p.data, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C")
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p.port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	// In postgresql.conf, not on the command line, so that ALTER SYSTEM
	// (-vary) can override them.
	conf := fmt.Sprintf("\n# bench scale\nautovacuum = %s\ncheckpoint_timeout = '%s'\nmax_wal_size = '%s'\n"+
		"wal_compression = '%s'\nshared_buffers = '%s'\nwal_keep_size = '%s'\nmax_connections = 200\n"+
		"log_checkpoints = on\nlog_autovacuum_min_duration = 0\n",
		s.Autovacuum, s.CheckpointTimeout, s.MaxWALSize, s.WALCompression, s.SharedBuffers, s.WALKeepSize)
	f, err := os.OpenFile(filepath.Join(p.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	args := []string{"-D", p.data, "-p", strconv.Itoa(p.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=" + dir}
	p.cmd = p.command("postgres", args...)
	if len(wrap) > 0 {
		cmd := exec.Command(wrap[0], append(append(wrap[1:], filepath.Join(p.bin, "postgres")), args...)...)
		cmd.SysProcAttr, cmd.Dir = p.cmd.SysProcAttr, p.cmd.Dir
		p.cmd = cmd
	}
	logFile, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	// Its own process group: a Ctrl-C reaches the benchmark, which stops
	// the server itself, in order.
	p.cmd.SysProcAttr.Setpgid = true
	if err := p.cmd.Start(); err != nil {
		logFile.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	p.exited = make(chan error, 1)
	go func() { p.exited <- p.cmd.Wait(); logFile.Close() }()
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if pingDB(p.url("postgres")) == nil {
			return p, nil
		}
		select {
		case err := <-p.exited:
			log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
			os.RemoveAll(dir)
			return nil, fmt.Errorf("postgres exited: %v\n%s", err, tail(log, 2000))
		default:
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("postgres did not answer within five minutes")
		}
	}
}

func (p *pgServer) command(name string, args ...string) *exec.Cmd {
	c := exec.Command(filepath.Join(p.bin, name), args...)
	c.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	c.Dir = p.dir
	return c
}

// url is the address of database db on this server, as the superuser.
func (p *pgServer) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.port, db)
}

// stop shuts the server down fast (SIGINT) and removes its directory.
func (p *pgServer) stop() {
	if p.attached {
		return
	}
	if p.cmd != nil && p.cmd.Process != nil {
		p.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-p.exited:
		case <-time.After(2 * time.Minute):
			p.cmd.Process.Kill()
			<-p.exited
		}
	}
	os.RemoveAll(p.dir)
}

// version is the server's version string.
func (p *pgServer) version(db *sql.DB) string {
	var v string
	db.QueryRow(`SHOW server_version`).Scan(&v)
	return strings.TrimSpace(v)
}
