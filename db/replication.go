package db

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
)

// Replication is what a server says of its synchronous replication. Any
// role may read both settings.
type Replication struct {
	StandbyNames string // synchronous_standby_names: empty when no standby is synchronous
	Commit       string // synchronous_commit, the server's default (the service's transactions raise it to on, adr/0002)
}

// ReplicationEvery is how often the service reads again whether the
// database has a synchronous standby, besides at each new connection.
const ReplicationEvery = 10 * time.Second

// replicationQuery reads both settings in one round trip.
const replicationQuery = `SELECT current_setting('synchronous_standby_names'), current_setting('synchronous_commit')`

// Synchronous reports whether a commit waits for a standby: only then does
// a failover to that standby keep every commit, and so every event the
// service acked (adr/0001). The service commits with synchronous_commit on
// whatever the server's default, so the standby names decide.
func (r Replication) Synchronous() bool { return strings.TrimSpace(r.StandbyNames) != "" }

// AsyncWarning is what the log (its message) and /readyz say when no
// standby is synchronous.
const AsyncWarning = "no synchronous standby is configured (synchronous_standby_names is empty): " +
	"if this server has asynchronous standbys, a failover may lose the last commits, events the service has already acked"

// asyncHint says how to prevent it.
const asyncHint = "name a synchronous standby: with Patroni, synchronous_mode: true (and synchronous_mode_strict: true to never commit without one); " +
	"without, synchronous_standby_names on the primary; REQUIRE_SYNC_STANDBY=true makes the service refuse to consume until then"

// ErrNoSyncStandby is the refusal of a transaction while REQUIRE_SYNC_STANDBY
// is set and the server names no synchronous standby: a transient failure
// of the environment, retried in place until one is configured.
var ErrNoSyncStandby = errors.New("REQUIRE_SYNC_STANDBY=true and the database names no synchronous standby " +
	"(synchronous_standby_names is empty): refusing to apply events a failover could lose")

// ReplicationWatch keeps what the server last said of its synchronous
// replication: read on every new connection (so at start and at each
// reconnect, a failover included) and by Run, periodically. It logs once
// when the server has no synchronous standby, and once when it gets one;
// with Require, it refuses every transaction meanwhile. A nil watch
// watches nothing and refuses nothing.
type ReplicationWatch struct {
	require bool
	log     *slog.Logger

	mu   sync.Mutex
	seen *Replication // nil until first read
}

// NewReplicationWatch returns a watch that logs to log and, with require,
// refuses transactions while no standby is synchronous.
func NewReplicationWatch(require bool, log *slog.Logger) *ReplicationWatch {
	return &ReplicationWatch{require: require, log: log}
}

// observe records r, logging when what it means changed.
func (w *ReplicationWatch) observe(r Replication) {
	w.mu.Lock()
	before := w.seen
	w.seen = &r
	w.mu.Unlock()
	if before != nil && before.Synchronous() == r.Synchronous() {
		return
	}
	switch {
	case r.Synchronous():
		w.log.Info("the database has a synchronous standby: a failover to it keeps every acked event",
			"synchronous_standby_names", r.StandbyNames, "synchronous_commit", r.Commit)
	case w.require:
		w.log.Error("refusing to consume: "+AsyncWarning, "hint", asyncHint, "synchronous_commit", r.Commit)
	default:
		w.log.Warn(AsyncWarning, "hint", asyncHint, "synchronous_commit", r.Commit)
	}
}

// Current returns what the server last said, and whether it said anything
// yet.
func (w *ReplicationWatch) Current() (Replication, bool) {
	if w == nil {
		return Replication{}, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen == nil {
		return Replication{}, false
	}
	return *w.seen, true
}

// refusal returns ErrNoSyncStandby while the watch refuses, else nil.
func (w *ReplicationWatch) refusal() error {
	if w == nil || !w.require {
		return nil
	}
	if r, ok := w.Current(); ok && !r.Synchronous() {
		return ErrNoSyncStandby
	}
	return nil
}

// Status returns /readyz's detail on replication, and false when the
// service refuses to consume because of it. Without a synchronous standby
// and without REQUIRE_SYNC_STANDBY it is a warning, not a reason to be
// unready.
func (w *ReplicationWatch) Status() (string, bool) {
	r, ok := w.Current()
	switch {
	case !ok:
		return "not read yet", !w.require
	case r.Synchronous():
		return fmt.Sprintf("ok: synchronous standby %q (synchronous_commit %s)", r.StandbyNames, r.Commit), true
	case w.require:
		return ErrNoSyncStandby.Error() + "; " + asyncHint, false
	}
	return "warning: " + AsyncWarning + "; " + asyncHint, true
}

// Check reads the settings through database and records them.
func (w *ReplicationWatch) Check(ctx context.Context, database *sqlx.DB) error {
	var r Replication
	if err := database.QueryRowxContext(ctx, replicationQuery).Scan(&r.StandbyNames, &r.Commit); err != nil {
		return fmt.Errorf("read synchronous_standby_names: %w", translate(err))
	}
	w.observe(r)
	return nil
}

// Run checks every interval until ctx ends, so that a standby named, or
// removed, without a reconnect is seen too. A failed check is left to the
// next: the connection's own failure shows elsewhere.
func (w *ReplicationWatch) Run(ctx context.Context, database *sqlx.DB, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			check, cancel := context.WithTimeout(ctx, every)
			_ = w.Check(check, database)
			cancel()
		}
	}
}

// WaitSynchronous returns once the server names a synchronous standby,
// checking with backoff meanwhile, or ctx's error. Without require it
// returns at once. waiting, when set, is told why it waits.
func (w *ReplicationWatch) WaitSynchronous(ctx context.Context, database *sqlx.DB, every time.Duration, waiting func(error)) error {
	for w.require {
		err := w.Check(ctx, database)
		if err == nil && w.refusal() == nil {
			return nil
		}
		if err == nil {
			err = ErrNoSyncStandby
		}
		if waiting != nil {
			waiting(err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
	return nil
}

// readOnConnect reads the settings on a new driver connection, before the
// pool uses it.
func (w *ReplicationWatch) readOnConnect(ctx context.Context, dc driver.Conn) error {
	if w == nil {
		return nil
	}
	rows, err := dc.(driver.QueryerContext).QueryContext(ctx, replicationQuery, nil)
	if err != nil {
		return err
	}
	defer rows.Close()
	dest := make([]driver.Value, 2)
	if err := rows.Next(dest); err != nil {
		return err
	}
	w.observe(Replication{StandbyNames: asString(dest[0]), Commit: asString(dest[1])})
	return nil
}

func asString(v driver.Value) string {
	switch v := v.(type) {
	case []byte:
		return string(v)
	case string:
		return v
	}
	return fmt.Sprint(v)
}
