package db

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"transferconsumer/retry"
)

// Behind is the error SchemaWhenReady reports while the schema lacks
// migrations that the service will not apply (MIGRATE=false) or may not
// (the database refused the role).
type Behind struct {
	Missing  []string // the migrations missing, in order
	Role     string   // the role the service connects as
	Disabled bool     // MIGRATE=false: the service never changes the schema
	Refused  error    // the database's refusal of the service's attempt
}

func (b *Behind) Error() string {
	why := "MIGRATE=false, so the service never changes the schema"
	if !b.Disabled {
		why = fmt.Sprintf("role %s may not change the schema (%v)", b.Role, b.Refused)
	}
	return fmt.Sprintf("the schema lacks migration(s) %s; %s: the schema's owner must run `transferconsumer migrate`",
		strings.Join(b.Missing, ", "), why)
}

// SchemaWhenReady returns nil once the schema has every migration in
// migrations, or ctx's error when ctx ends first. It checks by reading
// only (Pending), so that a role with no privilege beyond data starts on a
// current schema; only when migrations are missing and migrate is true
// does it apply them (Migrate). Until the schema is current it waits,
// checking again with backoff b, and tells waiting, when set, each
// failure:
//
//   - a *Behind when migrate is false (MIGRATE=false): it never migrates.
//   - a *Behind when the database refused its migration for want of a
//     privilege (42501): that does not heal by trying again, so it tries
//     no more, and from then on only checks.
//   - any other failure (the database lost, a read-only standby, a lock
//     timeout) as it is: retried, migration included, as before.
//
// A check is two SELECTs (see pending); backoff b is the reconnect's, so checks slow to
// one per RECONNECT_MAX and a migration the schema's owner runs meanwhile
// is picked up without a restart.
func SchemaWhenReady(ctx context.Context, db *sqlx.DB, migrations fs.FS, migrate bool, b retry.Backoff, log *slog.Logger, waiting func(error)) error {
	var th retry.Throttle
	var refused error // the refusal that ended migrating
	check := func() error {
		missing, role, err := pending(ctx, db, migrations)
		switch {
		case err != nil && Refused(err):
			return fmt.Errorf("%w: the schema's owner must grant role %s what it needs (`transferconsumer migrate --grant-to %[2]s`)", err, role)
		case err != nil:
			return err
		case len(missing) == 0:
			return nil
		case !migrate || refused != nil:
			return &Behind{Missing: missing, Role: role, Disabled: !migrate, Refused: refused}
		}
		applied, err := Migrate(ctx, db, migrations)
		switch {
		case err == nil:
			if len(applied) > 0 {
				log.Info("migrated", "applied", applied)
			}
			return nil
		case Refused(err):
			refused = err
			log.Error("the database refused the service's migration: it tries no more, and waits until the schema's owner has run `transferconsumer migrate`",
				"err", err, "role", role, "missing", missing)
			return &Behind{Missing: missing, Role: role, Refused: err}
		}
		return fmt.Errorf("migrate: %w", err)
	}
	for attempt := 0; ; attempt++ {
		err := check()
		if err == nil {
			if attempt > 0 {
				log.Info("the schema is current", "checks", attempt+1)
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if waiting != nil {
			waiting(err)
		}
		delay := b.Delay(attempt)
		if due, _ := th.Due(attempt+1, err.Error()); due {
			if behind := (*Behind)(nil); errors.As(err, &behind) {
				log.Error("the schema is behind: consuming nothing until it is current", "missing", behind.Missing,
					"err", err, "checks", attempt+1, "next_check_ms", delay.Milliseconds())
			} else {
				log.Error("schema check failed, retrying", "err", err, "attempts", attempt+1, "delay_ms", delay.Milliseconds())
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// pending is Pending that also returns the role it ran as. It reads with
// two SELECTs: whether schema_migration exists, the role, and the function
// files whose functions are not as the files make them; then, when the
// table exists, the versions it records.
func pending(ctx context.Context, db *sqlx.DB, migrations fs.FS) ([]string, string, error) {
	all, err := list(migrations)
	if err != nil {
		return nil, "", err
	}
	fns, err := functions(migrations)
	if err != nil {
		return nil, "", err
	}
	var found struct {
		Exists bool           `db:"exists"`
		Role   string         `db:"role"`
		Stale  pq.StringArray `db:"stale"`
	}
	if err := db.GetContext(ctx, &found, `SELECT to_regclass('schema_migration') IS NOT NULL AS exists, current_user AS role,
		array(`+staleSQL+`) AS stale`, staleArgs(fns)...); err != nil {
		return nil, "", fmt.Errorf("look for schema_migration: %w", err)
	}
	var done []int
	if found.Exists {
		if err := db.SelectContext(ctx, &done, `SELECT version FROM schema_migration`); err != nil {
			return nil, found.Role, fmt.Errorf("read schema_migration: %w", err)
		}
	}
	if newer(all, done) {
		return missing(all, done), found.Role, nil
	}
	return append(missing(all, done), found.Stale...), found.Role, nil
}
