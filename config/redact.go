package config

import (
	"net/url"
	"regexp"
	"strconv"
	"strings"
)

// A connection setting can carry a credential in three places, and each is
// hidden wherever the setting, or an error quoting it, is printed:
//
//   - the password of a URL's userinfo: postgres://u:s3cret@h/db
//   - a query parameter lib/pq reads: postgres://u@h/db?password=s3cret,
//     or sslpassword (the passphrase of the client key)
//   - a password in lib/pq's key=value form: host=h password=s3cret, or
//     password='s 3' quoted
//
// The user name stays, as url.URL.Redacted leaves it.

// hidden stands in for each credential.
const hidden = "xxxxx"

var (
	// scheme matches the beginning of a URL.
	scheme = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://`)
	// queryParam matches one key=value pair of a URL's query.
	queryParam = regexp.MustCompile(`[?&][^?&#=]*=[^&#]*`)
	// keyValue matches a password in lib/pq's key=value form: a key that
	// begins the text or follows a blank or a quote, "=" with optional
	// blanks around it, and a value either in single quotes (with backslash
	// escapes; unterminated, it runs to the end) or up to the next blank.
	keyValue = regexp.MustCompile(`(?i)((?:^|[\s"'(,;])\w*password\s*=\s*)('(?:[^'\\]|\\.)*'?|(?:\\.|[^\s"\\])*)`)
	// quoted matches a Go-quoted string in an error's text, with the blank
	// before it.
	quoted = regexp.MustCompile(` ?"(?:[^"\\]|\\.)*"`)
)

// Redact returns a connection setting (a URL, AMQP_URL's comma-separated
// list of them, or lib/pq's key=value form) with every credential hidden,
// for log lines and errors.
func Redact(setting string) string {
	wholeSetting := func(s string, _ int) int { return len(s) }
	return hideKeyValues(hideInURLs(setting, wholeSetting))
}

// RedactErr returns err's text with every credential in it hidden: a parse
// error quotes the URL it could not parse.
func RedactErr(err error) string { return RedactText(err.Error()) }

// RedactText returns s, any text, with the credentials of every URL or
// key=value connection string in it hidden.
func RedactText(s string) string { return hideKeyValues(hideInURLs(s, urlEndInText)) }

// hideInURLs hides the credentials of each URL in s; end(s, i) says where
// the URL beginning at i ends, and the next URL's scheme ends it sooner.
func hideInURLs(s string, end func(s string, start int) int) string {
	starts := scheme.FindAllStringIndex(s, -1)
	var b strings.Builder
	last := 0
	for i, m := range starts {
		e := end(s, m[0])
		if i+1 < len(starts) && starts[i+1][0] < e {
			e = starts[i+1][0]
		}
		b.WriteString(s[last:m[0]])
		b.WriteString(hideInURL(s[m[0]:e], m[1]-m[0]))
		last = e
	}
	b.WriteString(s[last:])
	return b.String()
}

// urlEndInText says where the URL beginning at start ends in free text. One
// quoted by %q (as a *url.Error quotes it) ends at its closing quote, since
// it may hold a blank that should have been percent-encoded; any other at
// a blank, a quote or an angle bracket.
func urlEndInText(s string, start int) int {
	if start > 0 && (s[start-1] == '"' || s[start-1] == '\'') {
		quote := s[start-1]
		for i := start; i < len(s); i++ {
			switch s[i] {
			case '\\':
				i++
			case quote:
				return i
			}
		}
		return len(s)
	}
	if i := strings.IndexAny(s[start:], " \t\r\n\"'<>`"); i >= 0 {
		return start + i
	}
	return len(s)
}

// hideInURL hides the credentials of u, one URL whose scheme and "://"
// take its first n bytes.
func hideInURL(u string, n int) string {
	rest := u[n:]
	if at := userinfoEnd(u, rest); at >= 0 {
		if user, _, hasPassword := strings.Cut(rest[:at], ":"); hasPassword {
			rest = user + ":" + hidden + rest[at:]
		}
	}
	rest = queryParam.ReplaceAllStringFunc(rest, func(p string) string {
		key, value, _ := strings.Cut(p[1:], "=")
		name := key
		if k, err := url.QueryUnescape(key); err == nil {
			name = k
		}
		if value == "" || !strings.Contains(strings.ToLower(name), "password") {
			return p
		}
		return p[:1] + key + "=" + hidden
	})
	return u[:n] + rest
}

// userinfoEnd returns the index in rest (u after its "scheme://") of the
// "@" that ends u's userinfo, or -1 when u has none.
//
// When u parses with a user, that is the last "@" of the authority, as the
// drivers read it. A password holding an unencoded "/", "?", "#" or "@"
// leaves a URL that does not parse, or parses as a host "user:digits" with
// the rest of the password in the path; then the userinfo is taken to end
// at the last "@" of all, hiding too much rather than too little.
func userinfoEnd(u, rest string) int {
	authority := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority = rest[:i]
	}
	parsed, err := url.Parse(u)
	switch {
	case err != nil:
		return strings.LastIndex(rest, "@")
	case parsed.User != nil:
		return strings.LastIndex(authority, "@")
	case strings.Contains(authority, ":"):
		return strings.LastIndex(rest, "@")
	}
	return -1
}

// hideKeyValues hides the passwords of lib/pq's key=value form in s.
func hideKeyValues(s string) string {
	return keyValue.ReplaceAllStringFunc(s, func(m string) string {
		sub := keyValue.FindStringSubmatch(m)
		if sub[2] == "" {
			return m
		}
		return sub[1] + hidden
	})
}

// reasonWithoutCredentials returns reason, an error's text about setting,
// without the quoted fragments of setting that its redacted form does not
// show, and whether it dropped any. A parser quotes the piece it stumbled
// on, and that piece may be part of a password: a "/" in one ends the host
// early, and url.Parse then reports the invalid port ":s3".
func reasonWithoutCredentials(reason, setting string) (string, bool) {
	shown := Redact(setting)
	dropped := false
	reason = quoted.ReplaceAllStringFunc(reason, func(q string) string {
		if s, err := strconv.Unquote(strings.TrimPrefix(q, " ")); err == nil && strings.Contains(shown, s) {
			return q
		}
		dropped = true
		return ""
	})
	return RedactText(reason), dropped
}
