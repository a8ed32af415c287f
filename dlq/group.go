package dlq

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"
)

// HeaderGroup is the fingerprint of a letter's failure (Fingerprint),
// written beside the class and the reason when the service dead-letters
// it. Replay takes it off with the other failure headers: a letter that
// fails again is fingerprinted by its new failure.
const HeaderGroup = "x-failure-group"

// The variable parts of a reason, in the order Template takes them out.
// Each rule is written against the reasons the service writes (event.Decode,
// db's translate and apply_effect.sql, consumer's producer check and panic
// recovery) and the one Describe writes for the broker's own dead letters;
// see adr/0015.
var templateRules = []struct {
	re   *regexp.Regexp
	with string
}{
	// A value a message brought, as event.Quote writes it: a Go-quoted
	// string, with its length said when it was cut.
	{regexp.MustCompile(`"(?:[^"\\]|\\.)*"(?:… \(\d+ bytes\))?`), `<q>`},
	// The accounts, amount and currency a transition carries and its
	// transfer holds (apply_effect.sql: "carries a→b 100 EUR").
	{regexp.MustCompile(`\S+→\S+ -?\d+ \S+?(,|$|\s)`), `<a>→<a> <n> <cur>$1`},
	{regexp.MustCompile(`\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b`), `<uuid>`},
	{regexp.MustCompile(`\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?`), `<time>`},
	// A number's sign goes with it: -100 and 0 fail alike. Numbers go
	// before long hex, so that a long number is a number; a hex string
	// with a letter in it holds no number between word boundaries.
	{regexp.MustCompile(`(^|[\s(\[:=,])-(\d)`), `$1$2`},
	{regexp.MustCompile(`\b\d+(?:\.\d+)?\b`), `<n>`},
	// A content fingerprint (a producer conflict), an address (a panic).
	{regexp.MustCompile(`\b0x[0-9a-fA-F]+\b`), `<hex>`},
	{regexp.MustCompile(`\b[0-9a-fA-F]{16,}\b`), `<hex>`},
}

// Template returns reason with its variable parts taken out: the values a
// message brought (quoted), UUIDs (event and transfer ids), times, long hex
// strings (content fingerprints, addresses), and numbers (amounts, counts,
// queue numbers), each replaced by a marker such as <uuid> or <n>, and its
// white space collapsed. Two failures that differ only in those parts have
// one template.
func Template(reason string) string {
	s := strings.Join(strings.Fields(reason), " ")
	for _, r := range templateRules {
		s = r.re.ReplaceAllString(s, r.with)
	}
	return s
}

// Fingerprint returns the group of a failure of class with reason: 12 hex
// digits of the SHA-256 of the class and Template(reason). It is stable
// across runs and releases (TestFingerprintIsStable pins it): it is written
// into letters (HeaderGroup) that outlive the release that wrote them, and
// an operator names a group by it (--group) from one run to the next.
func Fingerprint(class, reason string) string {
	sum := sha256.Sum256([]byte(class + "\x00" + Template(reason)))
	return hex.EncodeToString(sum[:6])
}

// IsFingerprint reports whether s has the form of a fingerprint: 12
// lower-case hex digits.
func IsFingerprint(s string) bool {
	if len(s) != 12 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
