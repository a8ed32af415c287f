package config

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/db"
	"transferconsumer/topology"
)

// urlProblem says why setting, or one URL of its list, does not parse,
// without quoting it: a *url.Error's text holds the whole URL, password
// included, so the reason is its inner error, stripped of any fragment
// that belongs to a credential.
func urlProblem(err error, setting string) string {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		err = ue.Err
	}
	reason, dropped := reasonWithoutCredentials(err.Error(), setting)
	if dropped || strings.Contains(reason, "userinfo") {
		reason += "; a / ? # @ % , or blank in a password must be percent-encoded"
	}
	return reason
}

// BrokerURLs returns the broker's URLs, one or one per node of a cluster:
// AMQP_URL's, or those in AMQP_URL_FILE, read now. Each must be an AMQP
// URL. An error names the variable (and the file) and never quotes a
// password.
func (c Config) BrokerURLs() ([]string, error) {
	setting, name, err := fromFile("AMQP_URL", c.AMQPURL, c.AMQPURLFile)
	if err != nil {
		return nil, err
	}
	urls := splitURLs(setting)
	for i, u := range urls {
		where := name
		if len(urls) > 1 {
			where = fmt.Sprintf("%s: URL %d", name, i+1)
		}
		if _, err := url.Parse(u); err != nil {
			return nil, fmt.Errorf("%s: not a URL (%s)", where, urlProblem(err, quotable(setting, c.AMQPURLFile)))
		}
		if _, err := amqp.ParseURI(u); err != nil {
			return nil, fmt.Errorf("%s: not an AMQP URL (%s)", where, urlProblem(err, quotable(setting, c.AMQPURLFile)))
		}
	}
	return urls, nil
}

// quotable returns what of setting an error may quote, redacted: all of
// it when it is a variable's value, nothing when it was read from a file.
// A file may hold anything, a bare password by mistake too, and nothing
// there is known to be safe to print.
func quotable(setting, file string) string {
	if file != "" {
		return ""
	}
	return setting
}

// Database returns DATABASE_URL, or what DATABASE_URL_FILE holds, read
// now, once it is checked to be a PostgreSQL URL. An error names the
// variable (and the file) and never quotes a password. It is the
// database pool's db.Source: asked again for each new connection.
func (c Config) Database() (string, error) {
	setting, name, err := fromFile("DATABASE_URL", c.DatabaseURL, c.DatabaseURLFile)
	if err != nil {
		return "", err
	}
	return postgresURL(setting, name, c.DatabaseURLFile)
}

// ReconcileDatabase returns RECONCILE_DATABASE_URL, checked as
// DATABASE_URL is, or "" when it is unset: the full reconciliation then
// reads DATABASE_URL's database.
func (c Config) ReconcileDatabase() (string, error) {
	if c.ReconcileDBURL == "" {
		return "", nil
	}
	return postgresURL(c.ReconcileDBURL, "RECONCILE_DATABASE_URL", "")
}

// postgresURL checks that setting, named name (read from file, when not
// ""), is a PostgreSQL URL or connection string, in either of libpq's
// forms, with one host or several (db.ParseDSN).
func postgresURL(setting, name, file string) (string, error) {
	dsn, err := db.ParseDSN(setting)
	switch {
	case errors.Is(err, db.ErrNotPostgres), err == nil && dsn.IsURI() && len(dsn.Hosts()) == 0:
		got := "the file holds something else"
		if file == "" {
			got = fmt.Sprintf("got %q", Redact(setting))
		}
		return "", fmt.Errorf("%s: want postgres://user@host:port/database?sslmode=…, %s", name, got)
	case err != nil && (strings.Contains(setting, "://") || !strings.Contains(setting, "=")):
		return "", fmt.Errorf("%s: not a URL (%s)", name, urlProblem(err, quotable(setting, file)))
	case err != nil:
		return "", fmt.Errorf("%s: not a connection string (%v)", name, err) // ParseDSN's quote no value
	}
	return setting, nil
}

// maxSecretFile bounds what is read of a *_FILE: a URL, not a disk image.
const maxSecretFile = 64 << 10

// fromFile returns a setting's value, and how to name it in an error: the
// variable's own value when file is "", else the file's content, read now,
// without the blanks and newline around it (a secret written by echo, or
// by an editor, ends with one). A file that cannot be read, is empty, or is
// larger than a URL has any reason to be is an error that names it.
func fromFile(variable, value, file string) (string, string, error) {
	if file == "" {
		return value, variable, nil
	}
	name := fmt.Sprintf("%s_FILE (%s)", variable, file)
	f, err := os.Open(file)
	if err != nil {
		return "", name, fmt.Errorf("%s_FILE: %w", variable, err) // *PathError names the file
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	switch {
	case err != nil:
		return "", name, fmt.Errorf("%s_FILE: %w", variable, err)
	case len(b) > maxSecretFile:
		return "", name, fmt.Errorf("%s: larger than %d KiB: not a URL", name, maxSecretFile>>10)
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", name, fmt.Errorf("%s: empty", name)
	}
	return v, name, nil
}

// splitURLs splits a list of URLs at commas, and at line ends (a file may
// hold one URL per line).
func splitURLs(setting string) []string {
	var urls []string
	for _, u := range strings.FieldsFunc(setting, func(r rune) bool { return r == ',' || r == '\n' || r == '\r' }) {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	if len(urls) == 0 {
		return []string{""} // ParseURI says what is wrong with it
	}
	return urls
}

// Management returns the management API MANAGEMENT_URL names, nil when it
// is unset (the configuration was validated at load).
func (c Config) Management() *topology.Management {
	m, _ := c.management()
	return m
}

// management returns the management API MANAGEMENT_URL names, nil when
// it is unset. An error names the variable and never quotes a password.
func (c Config) management() (*topology.Management, error) {
	if c.ManagementURL == "" && c.MgmtURLFile == "" {
		return nil, nil
	}
	u, err := c.managementURL()
	if err != nil {
		return nil, err
	}
	m := &topology.Management{URL: u}
	if c.MgmtURLFile != "" {
		m.URLFunc = c.managementURL
	}
	return m, nil
}

// managementURL returns MANAGEMENT_URL, or what MANAGEMENT_URL_FILE holds,
// read now, once it is checked to be an http or https URL.
func (c Config) managementURL() (*url.URL, error) {
	setting, name, err := fromFile("MANAGEMENT_URL", c.ManagementURL, c.MgmtURLFile)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(setting)
	if err != nil {
		return nil, fmt.Errorf("%s: not a URL (%s)", name, urlProblem(err, quotable(setting, c.MgmtURLFile)))
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		got := "the file holds something else"
		if c.MgmtURLFile == "" {
			got = fmt.Sprintf("got %q", Redact(setting))
		}
		return nil, fmt.Errorf("%s: want http[s]://[user:password@]host:port, %s", name, got)
	}
	return u, nil
}
