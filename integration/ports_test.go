package integration

import (
	"testing"

	"transferconsumer/consumer"
	"transferconsumer/db"
)

// The database implements the consumer's ports without importing the
// consumer; the service finds most of them by a type assertion, so a
// signature that drifts would silently turn a feature off. These fail the
// build (go vet included) instead.
var (
	_ consumer.Applier = (*db.Inbox)(nil)
	_ consumer.Lanes   = (*db.Inbox)(nil)
	_ consumer.Outbox  = (*db.Inbox)(nil)
	_ consumer.Parker  = (*db.Inbox)(nil)
	_ consumer.Prober  = (*db.Inbox)(nil)
)

// A database lane applies batches (adr/0006).
func TestTheInboxLanesApplyBatches(t *testing.T) {
	parallel(t)
	l := db.NewInbox(nil).Lane(0)
	if _, ok := l.(consumer.BatchLane); !ok {
		t.Fatalf("%T is not a consumer.BatchLane", l)
	}
}
