package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pki is a CA and two client certificates it signed, in PEM files.
type pki struct {
	dir                         string
	ca, cert, key, cert2, key2  string
	garbage, empty, missing, sd string
}

func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	p := pki{dir: dir}
	write := func(name string, b []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	p.ca = write("ca.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))
	leaf := func(n int64) ([]byte, []byte) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(n), Subject: pkix.Name{CommonName: "svc"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caTmpl, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	}
	c1, k1 := leaf(2)
	c2, k2 := leaf(3)
	p.cert, p.key = write("client.pem", c1), write("client.key", k1)
	p.cert2, p.key2 = write("other.pem", c2), write("other.key", k2)
	p.garbage = write("garbage.pem", []byte("not a certificate\n"))
	p.empty = write("empty.pem", nil)
	p.missing = filepath.Join(dir, "missing.pem")
	p.sd = filepath.Join(dir, "subdir")
	if err := os.Mkdir(p.sd, 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

// Each TLS file a URL names is read at start; one that cannot be used
// stops the service with the variable, the parameter, the file and why,
// and never the password.
func TestTLSFilesThatCannotBeUsedStopTheService(t *testing.T) {
	p := newPKI(t)
	const pass = "s3cret"
	amqps := func(query string) string { return "amqps://u:" + pass + "@broker:5671/vh?" + query }
	pg := func(query string) string { return "postgres://u:" + pass + "@db:5432/transfers?" + query }
	okAMQP := amqps("cacertfile=" + p.ca + "&certfile=" + p.cert + "&keyfile=" + p.key + "&auth_mechanism=external")
	okPG := pg("sslmode=verify-full&sslrootcert=" + p.ca + "&sslcert=" + p.cert + "&sslkey=" + p.key)
	tests := []struct {
		name       string
		amqp, db   string
		want       string // the whole error; "" for none
		wantPrefix bool   // want is the error's beginning (the OS's words follow)
	}{
		{"every file usable", okAMQP, okPG, "", false},
		{"no TLS", "amqp://u:" + pass + "@broker/", pg("sslmode=disable"), "", false},
		{"amqp:// ignores TLS parameters", "amqp://u:" + pass + "@broker/?cacertfile=" + p.missing, okPG, "", false},
		{"sslmode=disable ignores TLS parameters", okAMQP, pg("sslmode=disable&sslrootcert=" + p.missing), "", false},
		{"the system's CAs", okAMQP, pg("sslmode=verify-full&sslrootcert=system"), "", false},
		{"inline PEM", okAMQP, pg("sslinline=true&sslrootcert=x"), "", false},

		{"CA file missing", amqps("cacertfile=" + p.missing), okPG,
			`AMQP_URL: cacertfile "` + p.missing + `": cannot read it: no such file or directory`, false},
		{"CA file a directory", amqps("cacertfile=" + p.sd), okPG,
			`AMQP_URL: cacertfile "` + p.sd + `": cannot read it: `, true},
		{"CA file not PEM", amqps("cacertfile=" + p.garbage), okPG,
			`AMQP_URL: cacertfile "` + p.garbage + `": holds no PEM certificate`, false},
		{"CA file empty", amqps("cacertfile=" + p.empty), okPG,
			`AMQP_URL: cacertfile "` + p.empty + `": holds no PEM certificate`, false},
		{"CA file holding a key", amqps("cacertfile=" + p.key), okPG,
			`AMQP_URL: cacertfile "` + p.key + `": holds no PEM certificate`, false},
		{"certificate without its key", amqps("certfile=" + p.cert), okPG,
			`AMQP_URL: certfile "` + p.cert + `" is set without keyfile: a client certificate needs both`, false},
		{"key without its certificate", amqps("keyfile=" + p.key), okPG,
			`AMQP_URL: keyfile "` + p.key + `" is set without certfile: a client certificate needs both`, false},
		{"certificate file missing", amqps("certfile=" + p.missing + "&keyfile=" + p.key), okPG,
			`AMQP_URL: certfile "` + p.missing + `": cannot read it: no such file or directory`, false},
		{"certificate file holding a key", amqps("certfile=" + p.key + "&keyfile=" + p.key), okPG,
			`AMQP_URL: certfile "` + p.key + `": holds no PEM certificate`, false},
		{"key file holding a certificate", amqps("certfile=" + p.cert + "&keyfile=" + p.cert), okPG,
			`AMQP_URL: keyfile "` + p.cert + `": holds no PEM private key`, false},
		{"another certificate's key", amqps("certfile=" + p.cert + "&keyfile=" + p.key2), okPG,
			`AMQP_URL: keyfile "` + p.key2 + `": the key does not match the certificate in certfile "` + p.cert + `"`, false},
		{"the second node's URL", okAMQP + "," + amqps("cacertfile="+p.garbage), okPG,
			`AMQP_URL: URL 2: cacertfile "` + p.garbage + `": holds no PEM certificate`, false},

		{"root certificate missing", okAMQP, pg("sslmode=verify-full&sslrootcert=" + p.missing),
			`DATABASE_URL: sslrootcert "` + p.missing + `": cannot read it: no such file or directory`, false},
		{"root certificate not PEM", okAMQP, pg("sslmode=verify-full&sslrootcert=" + p.garbage),
			`DATABASE_URL: sslrootcert "` + p.garbage + `": holds no PEM certificate`, false},
		{"sslmode unset: lib/pq may still use them", okAMQP, pg("sslrootcert=" + p.garbage),
			`DATABASE_URL: sslrootcert "` + p.garbage + `": holds no PEM certificate`, false},
		{"several hosts", okAMQP, "postgres://u:" + pass + "@db1:5432,db2:5433/transfers?sslmode=verify-full&sslrootcert=" + p.missing,
			`DATABASE_URL: sslrootcert "` + p.missing + `": cannot read it: no such file or directory`, false},
		{"keyword form", okAMQP, "host=db1,db2 password=" + pass + " sslmode=verify-full sslrootcert='" + p.garbage + "'",
			`DATABASE_URL: sslrootcert "` + p.garbage + `": holds no PEM certificate`, false},
		{"keyword form, every file usable", okAMQP, "host=db1,db2 password=" + pass + " sslmode=verify-full sslrootcert=" + p.ca +
			" sslcert=" + p.cert + " sslkey=" + p.key, "", false},
		{"client certificate missing", okAMQP, pg("sslmode=verify-full&sslcert=" + p.missing + "&sslkey=" + p.key),
			`DATABASE_URL: sslcert "` + p.missing + `": cannot read it: no such file or directory`, false},
		{"client certificate without its key", okAMQP, pg("sslmode=verify-full&sslcert=" + p.cert),
			`DATABASE_URL: sslcert "` + p.cert + `" is set without sslkey: a client certificate needs both`, false},
		{"client key of another certificate", okAMQP, pg("sslmode=require&sslcert=" + p.cert + "&sslkey=" + p.key2),
			`DATABASE_URL: sslkey "` + p.key2 + `": the key does not match the certificate in sslcert "` + p.cert + `"`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Config{AMQPURL: tt.amqp, DatabaseURL: tt.db}.checkTLSFiles()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("got %v, want no error", err)
			case tt.want == "":
			case err == nil:
				t.Fatalf("got no error, want %s", tt.want)
			case tt.wantPrefix && !strings.HasPrefix(err.Error(), tt.want):
				t.Errorf("got  %v\nwant %s…", err, tt.want)
			case !tt.wantPrefix && err.Error() != tt.want:
				t.Errorf("got  %v\nwant %s", err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), pass) {
				t.Errorf("the error holds the password: %v", err)
			}
		})
	}
}

// lib/pq refuses a client key that group or others may read; the check
// says so at start, with the mode to give it.
func TestTLSClientKeyOpenToOthersStopsTheService(t *testing.T) {
	p := newPKI(t)
	if err := os.Chmod(p.key, 0o644); err != nil {
		t.Fatal(err)
	}
	db := "postgres://u@db/transfers?sslmode=verify-full&sslrootcert=" + p.ca + "&sslcert=" + p.cert + "&sslkey=" + p.key
	err := Config{AMQPURL: "amqp://u@broker/", DatabaseURL: db}.checkTLSFiles()
	want := `DATABASE_URL: sslkey "` + p.key + `": group or others may use it (mode 0644): lib/pq refuses it; make it 0600 (or 0640 owned by root)`
	if err == nil || err.Error() != want {
		t.Errorf("got  %v\nwant %s", err, want)
	}
	// amqp091-go does not care, and nor does the check.
	amqps := "amqps://u@broker/?cacertfile=" + p.ca + "&certfile=" + p.cert + "&keyfile=" + p.key
	if err := (Config{AMQPURL: amqps, DatabaseURL: "postgres://u@db/transfers"}).checkTLSFiles(); err != nil {
		t.Errorf("amqps with a 0644 key: %v", err)
	}
}

// A file that cannot be read is named with the reason the system gives
// (here a directory where the file should be, which fails for root too:
// a test that drops permissions would be skipped as root, and CI runs as
// root).
func TestTLSFileThatCannotBeReadStopsTheService(t *testing.T) {
	dir := t.TempDir()
	err := Config{AMQPURL: "amqps://u@broker/?cacertfile=" + dir, DatabaseURL: "postgres://u@db/transfers"}.checkTLSFiles()
	want := `AMQP_URL: cacertfile "` + dir + `": cannot read it: `
	if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("got  %v\nwant %s…is a directory", err, want)
	}
}

// The URLs in AMQP_URL_FILE and DATABASE_URL_FILE are checked alike, and
// the error names the file that holds the URL; loading the configuration
// runs the check.
func TestTLSFilesOfURLsInFiles(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	amqpFile, dbFile := filepath.Join(dir, "amqp"), filepath.Join(dir, "db")
	os.WriteFile(amqpFile, []byte("amqps://u:s3cret@n1/vh?cacertfile="+p.ca+"\namqps://u:s3cret@n2/vh?cacertfile="+p.garbage+"\n"), 0o600)
	os.WriteFile(dbFile, []byte("postgres://u:s3cret@db/transfers?sslmode=verify-full&sslrootcert="+p.missing+"\n"), 0o600)

	t.Setenv("AMQP_URL_FILE", amqpFile)
	_, err := Load()
	want := `configuration: AMQP_URL_FILE (` + amqpFile + `): URL 2: cacertfile "` + p.garbage + `": holds no PEM certificate`
	if err == nil || err.Error() != want {
		t.Errorf("got  %v\nwant %s", err, want)
	}
	os.WriteFile(amqpFile, []byte("amqps://u:s3cret@n1/vh?cacertfile="+p.ca+"\n"), 0o600)
	t.Setenv("DATABASE_URL_FILE", dbFile)
	_, err = Load()
	want = `configuration: DATABASE_URL_FILE (` + dbFile + `): sslrootcert "` + p.missing + `": cannot read it: no such file or directory`
	if err == nil || err.Error() != want {
		t.Errorf("got  %v\nwant %s", err, want)
	}
}
