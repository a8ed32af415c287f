package db

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"
)

// errProbed ends a probe's transaction: the probe always rolls back.
var errProbed = errors.New("probe done")

// Probe tells whether applying an event would work now, without applying
// one: it runs apply_event on a made-up transfer between two made-up
// accounts in a transaction it then rolls back. It passes only when
// everything an event needs answers: a connection, a writable primary, the
// role's login and grants, the schema and apply_event itself. It returns
// nil when it passed, else the failure, classified as Apply's are.
func (in *Inbox) Probe(ctx context.Context) error {
	id, transfer := probeUUID(), probeUUID()
	err := inTx(ctx, in.db, func(tx *sqlx.Tx) error {
		var outcome string
		if err := tx.QueryRowxContext(ctx, `SELECT apply_event($1, 'TransferCreated', '\x00'::bytea, $2,
			'transferconsumer-probe-a', 'transferconsumer-probe-b', 1, 'XXX', NULL, NULL, NULL, NULL, NULL)`, id, transfer).Scan(&outcome); err != nil {
			return err
		}
		return errProbed
	})
	if errors.Is(err, errProbed) {
		return nil
	}
	return fmt.Errorf("probe the database: %w", translate(err))
}

func probeUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
