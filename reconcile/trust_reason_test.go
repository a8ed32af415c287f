package reconcile

import (
	"strings"
	"testing"
)

// Each reason a pass gives for not trusting the checkpoint has its word
// of the metrics' vocabulary, and the words it is told by are those
// checkpointQuery says: a change there that this does not follow fails
// here, not on a dashboard that says "other".
func TestEveryDistrustOfTheCheckpointHasItsReason(t *testing.T) {
	cutoff := "123:130:"
	for _, w := range brokenWords {
		if !strings.Contains(checkpointQuery, "'"+w.prefix) {
			t.Errorf("checkpointQuery says no longer %q, by which %s is told", w.prefix, w.reason)
		}
	}
	for _, c := range []struct {
		name string
		c    Checkpoint
		want string
	}{
		{"trusted", Checkpoint{Present: true, cutoff: &cutoff}, TrustTrusted},
		{"none", Checkpoint{Broken: "there is none"}, TrustNone},
		{"forgotten", Checkpoint{Present: true, Broken: "a pass neutralized the transaction ids of another cluster in 4 rows"}, TrustForgotten},
		{"incomplete", Checkpoint{Present: true, cutoff: &cutoff, Broken: "it is incomplete"}, TrustIncomplete},
		{"copied", Checkpoint{Present: true, cutoff: &cutoff, Broken: "it was copied, not written here (the row's transaction 9 is not the one stamped in it, 7): …"}, TrustCopied},
		{"transfers gone", Checkpoint{Present: true, cutoff: &cutoff,
			Broken: "transfers it holds are gone: the transfer table was restored, or changed by hand"}, TrustTransfersGone},
		{"marked", Checkpoint{Present: true, cutoff: &cutoff, Distrusted: "by hand"}, TrustMarked},
		{"broken and marked", Checkpoint{Present: true, cutoff: &cutoff, Broken: "it was copied, …", Distrusted: "by hand"}, TrustCopied},
		{"a later release's", Checkpoint{Present: true, cutoff: &cutoff, Broken: "something new"}, TrustOther},
	} {
		if got := c.c.TrustReason(); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
