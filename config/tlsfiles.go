package config

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/db"
)

// The TLS files a connection URL names are read by the drivers only when
// they connect, and not always strictly: amqp091-go ignores a CA file it
// cannot parse (the handshake then fails with "certificate signed by
// unknown authority", which points at the broker rather than the file),
// and sends no client certificate when certfile or keyfile is missing;
// lib/pq quietly sends none when sslcert names no file. So the service
// reads each of them at start and refuses to run, naming the variable, the
// parameter and the file, rather than retrying a connection that cannot
// work or connecting without the certificate the estate asked for.

// checkTLSFiles checks the TLS files of every broker URL (amqps only:
// cacertfile, certfile and keyfile) and of the database URL (unless
// sslmode=disable: sslrootcert, sslcert and sslkey), read from the
// variables or from their files now. It returns the first problem, naming
// the variable (and the URL's place in AMQP_URL's list), the parameter,
// the file and why; it never quotes a URL, so never a password.
func (c Config) checkTLSFiles() error {
	setting, name, err := fromFile("AMQP_URL", c.AMQPURL, c.AMQPURLFile)
	if err != nil {
		return err
	}
	urls := splitURLs(setting)
	for i, u := range urls {
		where := name
		if len(urls) > 1 {
			where = fmt.Sprintf("%s: URL %d", name, i+1)
		}
		if err := checkAMQPTLSFiles(u); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	setting, name, err = fromFile("DATABASE_URL", c.DatabaseURL, c.DatabaseURLFile)
	if err != nil {
		return err
	}
	if err := checkPostgresTLSFiles(setting); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// checkAMQPTLSFiles checks the files an amqps URL names, as amqp091-go
// uses them: the CA certificates to verify the broker with, and the client
// certificate with its key, which it sends only when both are given.
func checkAMQPTLSFiles(raw string) error {
	u, err := amqp.ParseURI(raw)
	if err != nil || u.Scheme != "amqps" {
		return nil // a bad URL is the URL check's to report; amqp:// uses no TLS
	}
	if u.CACertFile != "" {
		if err := checkCAFile("cacertfile", u.CACertFile); err != nil {
			return err
		}
	}
	return checkKeyPair("certfile", u.CertFile, "keyfile", u.KeyFile, false)
}

// checkPostgresTLSFiles checks the files a PostgreSQL setting names, in
// either of libpq's forms, as lib/pq uses them: sslrootcert (unless
// "system"), and sslcert with sslkey, whose mode lib/pq checks too. Inline
// PEM (sslinline=true) names no files.
func checkPostgresTLSFiles(raw string) error {
	q, err := db.ParseDSN(raw)
	if err != nil {
		return nil // the URL check reports it
	}
	if q.Get("sslmode") == "disable" || q.Get("sslinline") == "true" {
		return nil
	}
	if root := q.Get("sslrootcert"); root != "" && root != "system" {
		if err := checkCAFile("sslrootcert", root); err != nil {
			return err
		}
	}
	return checkKeyPair("sslcert", q.Get("sslcert"), "sslkey", q.Get("sslkey"), true)
}

// checkCAFile checks that path can be read and holds at least one PEM
// certificate.
func checkCAFile(param, path string) error {
	b, err := readTLSFile(param, path)
	if err != nil {
		return err
	}
	if !x509.NewCertPool().AppendCertsFromPEM(b) {
		return fmt.Errorf("%s %q: holds no PEM certificate", param, path)
	}
	return nil
}

// checkKeyPair checks a client certificate and its key: both or neither
// given, each readable and PEM, and the key the certificate's. With
// private, the key file must also be closed to group and others, as
// lib/pq demands (0600, or 0640 when root owns it).
func checkKeyPair(certParam, certPath, keyParam, keyPath string, private bool) error {
	switch {
	case certPath == "" && keyPath == "":
		return nil
	case keyPath == "":
		return fmt.Errorf("%s %q is set without %s: a client certificate needs both", certParam, certPath, keyParam)
	case certPath == "":
		return fmt.Errorf("%s %q is set without %s: a client certificate needs both", keyParam, keyPath, certParam)
	}
	certPEM, err := readTLSFile(certParam, certPath)
	if err != nil {
		return err
	}
	keyPEM, err := readTLSFile(keyParam, keyPath)
	if err != nil {
		return err
	}
	if !hasPEM(certPEM, func(t string) bool { return t == "CERTIFICATE" }) {
		return fmt.Errorf("%s %q: holds no PEM certificate", certParam, certPath)
	}
	if !hasPEM(keyPEM, func(t string) bool { return strings.HasSuffix(t, "PRIVATE KEY") }) {
		return fmt.Errorf("%s %q: holds no PEM private key", keyParam, keyPath)
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		if strings.Contains(err.Error(), "does not match") {
			return fmt.Errorf("%s %q: the key does not match the certificate in %s %q", keyParam, keyPath, certParam, certPath)
		}
		return fmt.Errorf("%s %q and %s %q: %v", certParam, certPath, keyParam, keyPath, err)
	}
	if private {
		if err := keyModeOK(keyPath); err != nil {
			return fmt.Errorf("%s %q: %w", keyParam, keyPath, err)
		}
	}
	return nil
}

// readTLSFile reads path; an error names param and path and says why
// (the *PathError's own text would name the path a second time).
func readTLSFile(param, path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		reason := err
		if pe, ok := errors.AsType[*fs.PathError](err); ok {
			reason = pe.Err
		}
		return nil, fmt.Errorf("%s %q: cannot read it: %v", param, path, reason)
	}
	return b, nil
}

// hasPEM reports whether b holds a PEM block whose type is wanted.
func hasPEM(b []byte, wanted func(string) bool) bool {
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return false
		}
		if wanted(block.Type) {
			return true
		}
	}
}

// keyModeOK applies lib/pq's rule for a client key file: no permission
// for group or others, except read for the group when root owns it.
func keyModeOK(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	perm := fi.Mode().Perm()
	if perm&^0o600 == 0 {
		return nil
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid == 0 && perm&^0o640 == 0 {
		return nil
	}
	return fmt.Errorf("group or others may use it (mode %04o): lib/pq refuses it; make it 0600 (or 0640 owned by root)", perm)
}
