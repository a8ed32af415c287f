package cli

import (
	"errors"
	"testing"
	"time"

	"transferconsumer/journal"
)

// recover --accept-loss says exactly what it moved a queue's mark past:
// the entries (first to last), and for a journal message that does not
// parse its offset, the entries it holds (some the database may hold) and
// why; for a journal that does not reach back, since when.
func TestRecoverSaysExactlyWhatItsAcceptedLossSkips(t *testing.T) {
	since := time.Date(2026, 7, 10, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name string
		se   journal.ShortError
		want string
	}{
		{"a message that does not parse", journal.ShortError{Mark: 4, First: 7, Offset: int64(1234), Holds: [2]int64{3, 6},
			Unreadable: errors.New("unexpected end of JSON input")},
			"transfers.0: accepted the loss of entries 5 to 6 (2 events): the journal's message at offset 1234, " +
				"which holds entries 3 to 6, does not parse: unexpected end of JSON input"},
		{"a journal that does not reach back", journal.ShortError{Mark: 4, First: 8, Since: since},
			"transfers.0: accepted the loss of up to 3 events (entries 5 to 7) acked after 2026-07-10T12:00:00Z, which the journal no longer holds"},
	} {
		if got := accepted("transfers.0", &tt.se); got != tt.want {
			t.Errorf("%s:\n got %s\nwant %s", tt.name, got, tt.want)
		}
	}
}
