package integration

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// TLS to the broker and to the database, as an estate sets it up: amqps
// verified against the estate's CA, a client certificate instead of a
// password (EXTERNAL), PostgreSQL with sslmode=verify-full, and TLS files
// that cannot be used stopping the service at start. The broker is
// .ci/rabbitmq4's rabbit43, whose TLS listener takes passwords and client
// certificates; the database is a server of the test's own. These tests
// run once, in the pass against the shared broker: they choose their own.

// unknownAuthority is what Go's TLS says of a certificate that no trusted
// CA signed.
const unknownAuthority = "x509: certificate signed by unknown authority"

// tlsBroker is RabbitMQ with a TLS listener: the backend the test's vhost
// and publisher use (plain AMQP), the listener's amqps URL, and the CA that
// signed its certificate, with its key, for client certificates.
type tlsBroker struct {
	backend
	amqpsURL string
	ca       *testCA
}

// brokerTLS returns rabbit43 with its TLS listener, from TEST43_AMQP_URL,
// TEST43_MANAGEMENT_URL, TEST43_AMQPS_URL, TEST43_TLS_CA and
// TEST43_TLS_CA_KEY. Without them the test skips, except with CI=true,
// where that is a failure.
func brokerTLS(t *testing.T) tlsBroker {
	t.Helper()
	if unavailable != "" {
		t.Skip(unavailable)
	}
	vars := []string{"TEST43_AMQP_URL", "TEST43_MANAGEMENT_URL", "TEST43_AMQPS_URL", "TEST43_TLS_CA", "TEST43_TLS_CA_KEY"}
	for _, v := range vars {
		if os.Getenv(v) == "" {
			missing(t, "RabbitMQ with a TLS listener ("+strings.Join(vars, ", ")+": .ci/rabbitmq4 up, then eval \"$(.ci/rabbitmq4 env)\")")
		}
	}
	return tlsBroker{
		backend: backend{
			amqpURL:       os.Getenv("TEST43_AMQP_URL"),
			managementURL: os.Getenv("TEST43_MANAGEMENT_URL"),
			databaseURL:   shared.databaseURL,
		},
		amqpsURL: os.Getenv("TEST43_AMQPS_URL"),
		ca:       loadTestCA(t, os.Getenv("TEST43_TLS_CA"), os.Getenv("TEST43_TLS_CA_KEY")),
	}
}

// tlsURL returns b's amqps URL for e's vhost with query, and without the
// user and password when withPassword is false.
func (e *env) tlsURL(b tlsBroker, withPassword bool, query string) string {
	e.t.Helper()
	u, err := url.Parse(e.vhostURL(b.amqpsURL))
	if err != nil {
		e.t.Fatal(err)
	}
	if !withPassword {
		u.User = nil
	}
	u.RawQuery = query
	return u.String()
}

// The service connects over amqps, verifying the broker's certificate
// with the CA in cacertfile, logs in with its password, and applies.
func TestTLSBrokerVerifiedWithItsCA(t *testing.T) {
	parallel(t)
	b := brokerTLS(t)
	e := newEnvWith(t, b.backend)
	instance := e.name + "-svc"
	amqps := e.tlsURL(b, true, "cacertfile="+b.ca.file+"&server_name_indication=localhost")
	proc := startProcess(t, e.serviceEnv(2, "AMQP_URL="+amqps, "INSTANCE_NAME="+instance))
	proc.waitConsuming(1)

	tr := newTransfer("acc_a_"+e.name, "acc_b_"+e.name, 100)
	e.publish(tr)
	waitFor(t, 30*time.Second, "the transfer applied", func() bool { return e.inboxRows(tr.EventID) == 1 })
	if got := e.balance(tr.Data.ToAccount); got != 100 {
		t.Errorf("%s balance %d, want 100", tr.Data.ToAccount, got)
	}
	c := e.connectionNamed(b.backend, instance)
	if !c.SSL || c.Auth != "PLAIN" || c.User != "guest" {
		t.Errorf("the service's connection: TLS %v, mechanism %s, user %s; want TLS, PLAIN, guest", c.SSL, c.Auth, c.User)
	}
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
}

// With a CA that did not sign the broker's certificate the service does
// not connect; it says why, in its log and in /readyz, and keeps trying.
func TestTLSBrokerWithAnotherCAIsNotTrusted(t *testing.T) {
	parallel(t)
	b := brokerTLS(t)
	e := newEnvWith(t, b.backend)
	other := newTestCA(t, "another CA")
	amqps := e.tlsURL(b, true, "cacertfile="+other.file+"&server_name_indication=localhost")
	proc := startProcess(t, e.serviceEnv(2, "AMQP_URL="+amqps, "INSTANCE_NAME="+e.name+"-svc"))
	base := proc.httpAddr()

	waitFor(t, 30*time.Second, "two attempts that say the broker's certificate is not trusted", func() bool {
		return proc.linesSaying("broker session ended, reconnecting", "err", unknownAuthority) >= 2
	})
	t.Logf("the service says: %s", proc.field("broker session ended, reconnecting", "err"))
	var ready map[string]any
	if code := getJSON(t, base+"/readyz", &ready); code != 503 || !strings.Contains(fmt.Sprint(ready["broker"]), unknownAuthority) {
		t.Errorf("/readyz = %d %v, want 503 with the broker's reason", code, ready)
	}
	if n := proc.count("msg", "consuming"); n != 0 {
		t.Errorf("the service consumed %d times through an untrusted connection", n)
	}
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
}

// A client certificate the broker's CA signed, whose CN names a user with
// no password: the service logs in with EXTERNAL, applies, and its
// dead-letter connection, which reads the same URL, dead-letters a poison
// message.
func TestTLSClientCertificateLogsInWithEXTERNAL(t *testing.T) {
	parallel(t)
	b := brokerTLS(t)
	e := newEnvWith(t, b.backend)
	user := e.name + "_cert"
	// An empty hash: no password will ever log this user in.
	b.mgmt(t, http.MethodPut, "/api/users/"+url.PathEscape(user), map[string]string{"password_hash": "", "tags": ""}, nil)
	t.Cleanup(func() { b.mgmtQuiet(http.MethodDelete, "/api/users/"+url.PathEscape(user)) })
	b.mgmt(t, http.MethodPut, "/api/permissions/"+url.PathEscape(e.vhost)+"/"+url.PathEscape(user),
		map[string]string{"configure": ".*", "write": ".*", "read": ".*"}, nil)
	cert, key := b.ca.issue(user)

	instance := e.name + "-svc"
	amqps := e.tlsURL(b, false, "cacertfile="+b.ca.file+"&certfile="+cert+"&keyfile="+key+
		"&auth_mechanism=external&server_name_indication=localhost")
	proc := startProcess(t, e.serviceEnv(2, "AMQP_URL="+amqps, "INSTANCE_NAME="+instance))
	proc.waitConsuming(1)

	tr := newTransfer("acc_a_"+e.name, "acc_b_"+e.name, 250)
	e.publish(tr)
	e.publishRaw(prefix, tr.Data.FromAccount, []byte(`{"eventId": "not json`), "")
	waitFor(t, 30*time.Second, "the transfer applied and the poison message dead-lettered", func() bool {
		return proc.count("outcome", "applied") == 1 && proc.count("outcome", "dead_lettered") == 1
	})
	if got := e.balance(tr.Data.ToAccount); got != 250 {
		t.Errorf("%s balance %d, want 250", tr.Data.ToAccount, got)
	}
	letters := e.peekDLQ()
	if len(letters) != 1 || letters[0].header("x-failure-class") != "poison" {
		t.Errorf("DLQ holds %v, want the service's copy of the poison message (class poison)", letters)
	}
	for _, name := range []string{instance, instance + " dead-letters"} {
		c := e.connectionNamed(b.backend, name)
		if !c.SSL || c.Auth != "EXTERNAL" || c.User != user {
			t.Errorf("connection %q: TLS %v, mechanism %s, user %s; want TLS, EXTERNAL, %s", name, c.SSL, c.Auth, c.User, user)
		}
	}
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
}

// PostgreSQL over TLS with sslmode=verify-full: the service checks the
// server's certificate against sslrootcert and its name, applies, and
// with a client certificate (sslcert, sslkey) logs in as the role its CN
// names, without a password. With another CA it does not connect, and
// says why. The server refuses every connection without TLS.
func TestTLSDatabaseVerifyFull(t *testing.T) {
	parallel(t)
	if unavailable != "" {
		t.Skip(unavailable)
	}
	ca := newTestCA(t, "database CA")
	pg := newPGClusterTLS(t, ca)
	e := newEnvOn(t, fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=require", pg.addr()))

	proc := startProcess(t, e.serviceEnv(2, "DATABASE_URL="+pg.tlsURL(e.name, ca.file), "INSTANCE_NAME="+e.name+"-svc"))
	proc.waitConsuming(1)
	first := newTransfer("acc_a_"+e.name, "acc_b_"+e.name, 30)
	e.publish(first)
	waitFor(t, 30*time.Second, "the transfer applied over verify-full", func() bool { return e.inboxRows(first.EventID) == 1 })
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}

	// A client certificate for the role it names, which pg_hba.conf lets
	// in by certificate alone.
	role := pgCertRole
	admin := sqlx.MustOpen("postgres", e.dbURL)
	t.Cleanup(func() { admin.Close() })
	admin.MustExec("CREATE ROLE " + pq.QuoteIdentifier(role) + " LOGIN SUPERUSER")
	cert, key := ca.issue(role)
	u, _ := url.Parse(pg.tlsURL(e.name, ca.file))
	u.User = url.User(role)
	u.RawQuery += "&sslcert=" + cert + "&sslkey=" + key
	proc = startProcess(t, e.serviceEnv(2, "DATABASE_URL="+u.String(), "INSTANCE_NAME="+e.name+"-cert"))
	proc.waitConsuming(1)
	second := newTransfer("acc_a_"+e.name, "acc_b_"+e.name, 12)
	e.publish(second)
	waitFor(t, 30*time.Second, "the transfer applied as the certificate's role", func() bool { return e.inboxRows(second.EventID) == 1 })
	var sessions int
	admin.Get(&sessions, `SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
		WHERE a.usename = $1 AND s.ssl AND s.client_dn = '/CN=' || $1`, role)
	if sessions == 0 {
		t.Errorf("no session of %s with its client certificate", role)
	}
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	e.checkExactlyOnce([]transfer{first, second})

	other := newTestCA(t, "another CA")
	proc = startProcess(t, e.serviceEnv(2, "DATABASE_URL="+pg.tlsURL(e.name, other.file), "INSTANCE_NAME="+e.name+"-other"))
	base := proc.httpAddr()
	waitFor(t, 30*time.Second, "two attempts that say the server's certificate is not trusted", func() bool {
		return proc.linesSaying("database not reachable, waiting", "err", unknownAuthority) >= 2
	})
	t.Logf("the service says: %s", proc.field("database not reachable, waiting", "err"))
	var ready map[string]any
	if code := getJSON(t, base+"/readyz", &ready); code != 503 || !strings.Contains(fmt.Sprint(ready["database"]), unknownAuthority) {
		t.Errorf("/readyz = %d %v, want 503 with the database's reason", code, ready)
	}
	if err := proc.stop(syscall.SIGTERM, 20*time.Second); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
}

// A TLS file that cannot be used stops the service at start, exit status
// 1, with a message that names the variable, the parameter and the file,
// and not the password: amqp091-go would have ignored the CA file and
// failed each handshake, lib/pq would have said nothing of the missing
// root certificate until it connected.
func TestTLSFileUnusableStopsTheServiceAtStart(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	garbage := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	missingFile := filepath.Join(dir, "root.crt")
	const password = "s3cret-tls"
	tests := []struct {
		env  []string
		want string
	}{
		{[]string{"AMQP_URL=amqps://guest:" + password + "@localhost:5671/?cacertfile=" + garbage, "DATABASE_URL=postgres://postgres@localhost/transfers"},
			`error: configuration: AMQP_URL: cacertfile "` + garbage + `": holds no PEM certificate`},
		{[]string{"AMQP_URL=amqp://guest:guest@localhost/", "DATABASE_URL=postgres://u:" + password + "@localhost/transfers?sslmode=verify-full&sslrootcert=" + missingFile},
			`error: configuration: DATABASE_URL: sslrootcert "` + missingFile + `": cannot read it: no such file or directory`},
	}
	for _, tt := range tests {
		out, err := runCommand(t, append(tt.env, "AMQP_URL_FILE=", "DATABASE_URL_FILE=", "HTTP_ADDR="))
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Errorf("exit: %v, want status 1\n%s", err, out)
		}
		if !strings.Contains(out, tt.want) {
			t.Errorf("output does not say %q:\n%s", tt.want, out)
		}
		if strings.Contains(out, password) {
			t.Errorf("the output holds the password:\n%s", out)
		}
	}
}

// pgCertRole is the role newPGClusterTLS's pg_hba.conf lets in by client
// certificate alone.
const pgCertRole = "tc_tls_cert"

// linesSaying returns how many log lines whose msg is msg hold sub in
// key.
func (p *process) linesSaying(msg, key, sub string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, line := range p.lines {
		if line["msg"] == msg && strings.Contains(fmt.Sprint(line[key]), sub) {
			n++
		}
	}
	return n
}

// brokerConnection is a connection as the management API lists it.
type brokerConnection struct {
	SSL   bool   `json:"ssl"`
	Auth  string `json:"auth_mechanism"`
	User  string `json:"user"`
	Props struct {
		Name string `json:"connection_name"`
	} `json:"client_properties"`
}

// connectionNamed returns e's vhost's connection whose client-provided
// name is name on b, once the management API lists it.
func (e *env) connectionNamed(b backend, name string) brokerConnection {
	e.t.Helper()
	var found brokerConnection
	waitFor(e.t, 30*time.Second, "connection "+name+" to be listed", func() bool {
		var conns []brokerConnection
		if b.mgmtErr(http.MethodGet, "/api/vhosts/"+url.PathEscape(e.vhost)+"/connections", nil, &conns) != nil {
			return false
		}
		for _, c := range conns {
			if c.Props.Name == name {
				found = c
				return true
			}
		}
		return false
	})
	return found
}
