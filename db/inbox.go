package db

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// InboxDaysAhead is how many days of inbox partitions Maintain keeps made
// ahead of today (adr/0011): a CronJob that stops is noticed (the
// inbox_days_ahead metric, its alert) weeks before claims go to a
// partition retention cannot drop for a year.
const InboxDaysAhead = 31

// Maintain runs inbox_maintain: it makes the inbox partitions of the next
// InboxDaysAhead days, drops the ones whose ids are all older than ttl
// (moving their rows claimed within ttl to the default partition first),
// and drops processed_event_legacy once all of it is older than ttl. It
// returns what it did, a line each. Only the schema's owner may: another
// role is refused with 42501 (see Refused). ttl must be the service's
// INBOX_TTL, or longer.
func Maintain(ctx context.Context, db *sqlx.DB, ttl time.Duration) ([]string, error) {
	var done pq.StringArray
	err := inTx(ctx, db, func(tx *sqlx.Tx) error {
		return tx.GetContext(ctx, &done, `SELECT inbox_maintain($1::interval, $2)`,
			fmt.Sprintf("%d milliseconds", ttl.Milliseconds()), InboxDaysAhead)
	})
	if err != nil {
		return nil, fmt.Errorf("inbox maintenance: %w", err)
	}
	return done, nil
}

// DaysAhead returns how many days from tomorrow on have their own inbox
// partition (inbox_days_ahead), and false when the inbox is not
// partitioned. Any role may ask.
func DaysAhead(ctx context.Context, db *sqlx.DB) (int, bool, error) {
	var n sql.NullInt64
	if err := db.GetContext(ctx, &n, `SELECT inbox_days_ahead()`); err != nil {
		return 0, false, translate(err)
	}
	return int(n.Int64), n.Valid, nil
}
