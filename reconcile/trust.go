package reconcile

import "strings"

// The reasons a periodic pass did not trust the checkpoint, and so made
// it anew in a full pass instead of starting from it: a small, fixed
// vocabulary, for a metric's label (the words are in the pass's log,
// checkpoint_not_trusted, and its report). Each but TrustMarked and
// TrustNone is told from checkpointQuery's words (broken).
const (
	TrustTrusted       = "trusted"        // the pass could start from it
	TrustNone          = "none"           // there is none: the first pass of this database
	TrustForgotten     = "forgotten"      // a pass forgot it, having neutralized another cluster's transaction ids
	TrustIncomplete    = "incomplete"     // it was never written whole
	TrustCopied        = "copied"         // copied, not written here: a dump restored, logical replication
	TrustTransfersGone = "transfers-gone" // transfers it holds are gone: the table restored, or changed by hand
	TrustMarked        = "marked"         // a full pass (on the standby) found transfers changed since it, or a person marked it
	TrustOther         = "other"          // a reason of a later release: the log has its words
)

// TrustReasons are the reasons above, each once.
func TrustReasons() []string {
	return []string{TrustTrusted, TrustNone, TrustForgotten, TrustIncomplete, TrustCopied, TrustTransfersGone, TrustMarked, TrustOther}
}

// The beginnings of checkpointQuery's words for each reason it gives.
var brokenWords = []struct{ reason, prefix string }{
	{TrustIncomplete, "it is incomplete"},
	{TrustCopied, "it was copied"},
	{TrustTransfersGone, "transfers it holds are gone"},
}

// TrustReason names, in the vocabulary above, why the pass that read c
// did not trust it; TrustTrusted when it did.
func (c Checkpoint) TrustReason() string {
	switch {
	case c.trusted():
		return TrustTrusted
	case !c.Present:
		return TrustNone
	case c.Broken == "":
		return TrustMarked
	case c.cutoff == nil:
		return TrustForgotten
	}
	for _, w := range brokenWords {
		if strings.HasPrefix(c.Broken, w.prefix) {
			return w.reason
		}
	}
	return TrustOther
}
