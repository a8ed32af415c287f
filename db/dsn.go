package db

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
)

// DSN is a PostgreSQL connection setting in either of libpq's forms, read
// once here for everything that looks into it or rewrites it: the driver,
// the creation of a missing database, the TLS file checks, the logs.
//
//   - the URI, with one host or several, each with its own port:
//     postgres://u@h1:5432,h2:5433/db?sslmode=disable&target_session_attrs=read-write
//   - keyword/value pairs, a value quoted with ' when it holds a blank:
//     host=h1,h2 port=5432,5433 user=u dbname=db target_session_attrs=read-write
//
// lib/pq reads both, but its URI parser does not split host:port pairs (it
// dials "h1:5432:5432"), so the driver is always given the keyword form
// (Driver), in which host and port are lists of the same length.
type DSN struct {
	scheme string     // "postgres" or "postgresql" for the URI form; "" for keyword/value
	params []keyValue // libpq's keywords in the order given; host and port hold comma-separated lists
}

type keyValue struct{ key, value string }

// ErrNotPostgres is ParseDSN's error for a setting in neither form: another
// scheme, or text without a single key=value.
var ErrNotPostgres = errors.New("not a PostgreSQL connection setting")

// defaultPort is PostgreSQL's, given to a host of a multi-host URI that
// names none: the keyword form needs one port per host.
const defaultPort = "5432"

// ParseDSN reads s in either form. Its errors never quote s, which may hold
// a password: a URI's are url.Parse's (a *url.Error, whose inner error
// quotes at most the piece that did not parse), the keyword form's name
// only the place. A setting in neither form is ErrNotPostgres.
func ParseDSN(s string) (DSN, error) {
	scheme, _, isURI := strings.Cut(s, "://")
	switch {
	case isURI && (scheme == "postgres" || scheme == "postgresql"):
		return parseURI(s, scheme)
	case isURI || !strings.Contains(s, "="):
		if _, err := url.Parse(s); err != nil && !isURI {
			return DSN{}, err // "::" and the like: not a URL at all
		}
		return DSN{}, ErrNotPostgres
	}
	return parseKeywords(s)
}

// parseURI reads libpq's URI form. A single host is url.Parse's alone; with
// several, the authority's host list is split first and each host checked
// as url.Parse checks one.
func parseURI(s, scheme string) (DSN, error) {
	rest := s[len(scheme)+3:]
	authority := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority = rest[:i]
	}
	userinfo, hostList := "", authority
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		userinfo, hostList = authority[:at+1], authority[at+1:]
	}
	hosts := strings.Split(hostList, ",")
	// The rest of the URI, with the first host alone, parses as any URL.
	u, err := url.Parse(scheme + "://" + userinfo + hosts[0] + rest[len(authority):])
	if err != nil {
		return DSN{}, err
	}
	d := DSN{scheme: scheme}
	if u.User != nil {
		d.set("user", u.User.Username())
		if p, ok := u.User.Password(); ok {
			d.set("password", p)
		}
	}
	names, ports := make([]string, len(hosts)), make([]string, len(hosts))
	anyPort := false
	for i, h := range hosts {
		hu := u
		if i > 0 {
			if hu, err = url.Parse(scheme + "://" + h + "/"); err != nil {
				return DSN{}, err
			}
		}
		if hu.Host == "" && len(hosts) > 1 {
			return DSN{}, fmt.Errorf("host %d of %d is empty", i+1, len(hosts))
		}
		names[i], ports[i] = hu.Hostname(), hu.Port()
		anyPort = anyPort || ports[i] != ""
	}
	if hostList != "" {
		d.set("host", strings.Join(names, ","))
	}
	if anyPort {
		for i := range ports {
			if ports[i] == "" {
				ports[i] = defaultPort
			}
		}
		d.set("port", strings.Join(ports, ","))
	}
	if len(u.Path) > 1 {
		d.set("dbname", u.Path[1:])
	}
	// The query in its own order, so that a parameter given twice ends as
	// libpq ends it, with the last.
	for _, pair := range strings.Split(u.RawQuery, "&") {
		if pair == "" {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		key, kerr := url.QueryUnescape(k)
		value, verr := url.QueryUnescape(v)
		if kerr != nil || verr != nil {
			return DSN{}, errors.New("a query parameter has an invalid % escape")
		}
		if !isKeyword(key) {
			// libpq's keywords are words; the driver's form could not
			// carry another key, and libpq refuses one too.
			return DSN{}, fmt.Errorf("query parameter %d is not a connection keyword", len(d.params)+1)
		}
		d.set(key, value)
	}
	return d, nil
}

// parseKeywords reads libpq's keyword/value form: key = value pairs apart
// by blanks, a value quoted with ' when it holds blanks, \ escaping the
// next character. It reads bytes, not runes: every delimiter is ASCII, and
// a value's bytes pass through as they are, valid UTF-8 or not.
func parseKeywords(s string) (DSN, error) {
	var d DSN
	r := []byte(s)
	i := 0
	blank := func() {
		for i < len(r) && isBlank(r[i]) {
			i++
		}
	}
	for n := 1; ; n++ {
		blank()
		if i == len(r) {
			break
		}
		start := i
		for i < len(r) && !isBlank(r[i]) && r[i] != '=' {
			i++
		}
		key := string(r[start:i])
		blank()
		if i == len(r) || r[i] != '=' || key == "" {
			return DSN{}, fmt.Errorf(`pair %d has no "key=" before its value`, n)
		}
		i++ // the '='
		blank()
		var value []byte
		if i < len(r) && r[i] == '\'' {
			i++
			for ; ; i++ {
				if i == len(r) {
					return DSN{}, fmt.Errorf("the value of %s has no closing quote", key)
				}
				if r[i] == '\\' && i+1 < len(r) {
					i++
				} else if r[i] == '\'' {
					i++
					break
				}
				value = append(value, r[i])
			}
		} else {
			for ; i < len(r) && !isBlank(r[i]); i++ {
				if r[i] == '\\' && i+1 < len(r) {
					i++
				}
				value = append(value, r[i])
			}
		}
		d.set(key, string(value))
	}
	if len(d.params) == 0 {
		return DSN{}, ErrNotPostgres
	}
	return d, nil
}

// isKeyword reports whether key can be a libpq connection keyword (or a
// run-time parameter lib/pq passes on): letters, digits and underscores.
func isKeyword(key string) bool {
	if key == "" {
		return false
	}
	for _, r := range key {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

func isBlank(r byte) bool {
	return r == ' ' || r == '\t' || r == '\n' || r == '\r' || r == '\f' || r == '\v'
}

// set sets key to value, where it first appeared, or at the end.
func (d *DSN) set(key, value string) {
	for i := range d.params {
		if d.params[i].key == key {
			d.params[i].value = value
			return
		}
	}
	d.params = append(d.params, keyValue{key, value})
}

// Get returns key's value ("" when unset), by libpq's keyword (dbname,
// host, port, sslmode, target_session_attrs, …) in either form.
func (d DSN) Get(key string) string {
	for _, p := range d.params {
		if p.key == key {
			return p.value
		}
	}
	return ""
}

// IsURI reports whether d was given as a URI.
func (d DSN) IsURI() bool { return d.scheme != "" }

// With returns a copy of d with key set to value: another database for the
// creation of a missing one, say.
func (d DSN) With(key, value string) DSN {
	c := DSN{scheme: d.scheme, params: append([]keyValue(nil), d.params...)}
	c.set(key, value)
	return c
}

// Hosts returns each host with its port, "host:port" (or the host alone
// when no port is given), in the order they are tried.
func (d DSN) Hosts() []string {
	hosts := splitList(d.Get("host"))
	if len(hosts) == 0 {
		hosts = splitList(d.Get("hostaddr"))
	}
	ports := splitList(d.Get("port"))
	out := make([]string, len(hosts))
	for i, h := range hosts {
		switch {
		case len(ports) == len(hosts):
			out[i] = net.JoinHostPort(h, ports[i])
		case len(ports) == 1:
			out[i] = net.JoinHostPort(h, ports[0])
		default:
			out[i] = h
		}
	}
	return out
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// Driver returns d in the keyword form lib/pq reads correctly for every
// host list, every value quoted.
func (d DSN) Driver() string {
	var b strings.Builder
	for i, p := range d.params {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(p.key + "=" + quoteValue(p.value))
	}
	return b.String()
}

var valueQuoter = strings.NewReplacer(`\`, `\\`, `'`, `\'`)

func quoteValue(v string) string { return "'" + valueQuoter.Replace(v) + "'" }

// hidden stands in for each secret in Redacted.
const hidden = "xxxxx"

// isSecret reports whether key's value is a secret: password, sslpassword.
func isSecret(key string) bool { return strings.Contains(strings.ToLower(key), "password") }

// Redacted returns d in the form it was given, with every secret (the
// password, the client key's sslpassword) hidden, for logs and errors.
func (d DSN) Redacted() string {
	if !d.IsURI() {
		var b strings.Builder
		for i, p := range d.params {
			if i > 0 {
				b.WriteByte(' ')
			}
			v := p.value
			if isSecret(p.key) && v != "" {
				v = hidden
			}
			if v == "" || strings.ContainsAny(v, " \t\n\r\f\v'\\") {
				v = quoteValue(v)
			}
			b.WriteString(p.key + "=" + v)
		}
		return b.String()
	}
	var b strings.Builder
	b.WriteString(d.scheme + "://")
	if user := d.Get("user"); user != "" || d.Get("password") != "" {
		b.WriteString(url.User(user).String())
		if d.Get("password") != "" {
			b.WriteString(":" + hidden)
		}
		b.WriteByte('@')
	}
	hosts, ports := splitList(d.Get("host")), splitList(d.Get("port"))
	for i, h := range hosts {
		if i > 0 {
			b.WriteByte(',')
		}
		if strings.Contains(h, ":") {
			h = "[" + h + "]"
		}
		b.WriteString(h)
		if len(ports) == len(hosts) {
			b.WriteString(":" + ports[i])
		}
	}
	if db := d.Get("dbname"); db != "" {
		b.WriteString("/" + url.PathEscape(db))
	}
	sep := "?"
	for _, p := range d.params {
		switch p.key {
		case "user", "password", "host", "dbname":
			continue
		case "port":
			if len(ports) == len(hosts) && len(hosts) > 0 {
				continue
			}
		}
		v := url.QueryEscape(p.value)
		if isSecret(p.key) && p.value != "" {
			v = hidden
		}
		b.WriteString(sep + url.QueryEscape(p.key) + "=" + v)
		sep = "&"
	}
	return b.String()
}

// secrets returns the values Redacted hides.
func (d DSN) secrets() []string {
	var out []string
	for _, p := range d.params {
		if isSecret(p.key) && p.value != "" {
			out = append(out, p.value)
		}
	}
	return out
}
