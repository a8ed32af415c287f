package integration

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// testCA is a certificate authority a test signs certificates with: one
// it made itself, or the CI broker's, whose key .ci/rabbitmq4 keeps.
type testCA struct {
	t    *testing.T
	cert *x509.Certificate
	key  crypto.Signer
	file string // the CA certificate, PEM
}

// newTestCA makes a CA of the test's own, its certificate in a file.
func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &testCA{t: t, cert: cert, key: key}
	ca.file = writePEM(t, t.TempDir(), "ca.pem", "CERTIFICATE", der, 0o644)
	return ca
}

// loadTestCA reads a CA's certificate and key from PEM files, the key in
// PKCS #8 (as openssl writes it) or SEC 1 form.
func loadTestCA(t *testing.T, certFile, keyFile string) *testCA {
	t.Helper()
	read := func(path string) *pem.Block {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		block, _ := pem.Decode(b)
		if block == nil {
			t.Fatalf("%s holds no PEM", path)
		}
		return block
	}
	cert, err := x509.ParseCertificate(read(certFile).Bytes)
	if err != nil {
		t.Fatalf("%s: %v", certFile, err)
	}
	block := read(keyFile)
	var key any
	if key, err = x509.ParsePKCS8PrivateKey(block.Bytes); err != nil {
		key, err = x509.ParseECPrivateKey(block.Bytes)
	}
	if err != nil {
		t.Fatalf("%s: %v", keyFile, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		t.Fatalf("%s: a %T cannot sign", keyFile, key)
	}
	return &testCA{t: t, cert: cert, key: signer, file: certFile}
}

// issue signs a certificate for cn with a new key and writes both to a
// directory of the test's, the key 0600 (as lib/pq demands of a client
// key). With hosts it is a server's certificate for them (names or IP
// addresses), else a client's. It returns the two files' paths.
func (ca *testCA) issue(cn string, hosts ...string) (certFile, keyFile string) {
	t := ca.t
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if len(hosts) > 0 {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	return writePEM(t, dir, "cert.pem", "CERTIFICATE", der, 0o644), writePEM(t, dir, "key.pem", "PRIVATE KEY", keyDER, 0o600)
}

// pem returns the CA's certificate in PEM.
func (ca *testCA) pem() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})
}

func writePEM(t *testing.T, dir, name, kind string, der []byte, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), mode); err != nil {
		t.Fatal(err)
	}
	return path
}

func serial(t *testing.T) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// newPGClusterTLS is newPGCluster with TLS: ssl=on with a server
// certificate ca signs for localhost and 127.0.0.1, and a pg_hba.conf
// that refuses every TCP connection without TLS, so that what connects at
// all connects over TLS. Role pgCertRole logs in by a client certificate
// ca signed, every other role without one.
func newPGClusterTLS(t *testing.T, ca *testCA) *pgCluster {
	t.Helper()
	c := &pgCluster{t: t, bin: pgBinDir(t), port: freePort(t)}
	c.dir = pgDataDir(t)
	c.run("initdb", "-D", c.dir, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "--no-sync")
	certFile, keyFile := ca.issue("localhost", "localhost", "127.0.0.1")
	for from, to := range map[string]string{certFile: "server.crt", keyFile: "server.key"} {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		c.writeOwned(to, b) // the server wants its key 0600 and its own
	}
	c.writeOwned("root.crt", ca.pem())
	c.appendConf("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\nssl_ca_file = 'root.crt'\n")
	hba := "local all all trust\nhostnossl all all 0.0.0.0/0 reject\nhostnossl all all ::/0 reject\n"
	for _, net := range []string{"127.0.0.1/32", "::1/128"} {
		hba += "hostssl all " + pgCertRole + " " + net + " cert\nhostssl all all " + net + " trust\n"
	}
	c.writeOwned("pg_hba.conf", []byte(hba))
	c.start()
	return c
}

// writeOwned writes name in the data directory, 0600, owned by the user
// the server runs as.
func (c *pgCluster) writeOwned(name string, b []byte) {
	c.t.Helper()
	path := filepath.Join(c.dir, name)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		c.t.Fatal(err)
	}
	st, err := os.Stat(c.dir)
	if err != nil {
		c.t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		uid, gid := ownerOf(c.t, st)
		if err := os.Chown(path, uid, gid); err != nil {
			c.t.Fatal(err)
		}
	}
}

func (c *pgCluster) appendConf(lines string) {
	c.t.Helper()
	f, err := os.OpenFile(filepath.Join(c.dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("\n" + lines); err != nil {
		c.t.Fatal(err)
	}
}

// tlsURL is a URL to database name on c as the superuser, over TLS checked
// against the CA in rootCert: verify-full, by the name localhost.
func (c *pgCluster) tlsURL(name, rootCert string) string {
	return "postgres://postgres@localhost:" + strconv.Itoa(c.port) + "/" + name +
		"?sslmode=verify-full&sslrootcert=" + rootCert
}

// ownerOf returns the user and group that own a file.
func ownerOf(t *testing.T, fi os.FileInfo) (int, int) {
	t.Helper()
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		t.Fatalf("no owner known for %s", fi.Name())
	}
	return int(st.Uid), int(st.Gid)
}
