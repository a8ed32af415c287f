package db

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jmoiron/sqlx"
)

// migrationLock is the advisory lock key that serialises migrations, so two
// replicas starting at once apply each migration exactly once.
const migrationLock = 7_301_001

// Migrate applies, in order, every NNNN_name.sql file in migrations that the
// database has not recorded yet, all in one transaction under an advisory
// lock: a replica that starts at the same moment waits, then finds nothing
// left to do. It returns the names of the migrations it applied.
func Migrate(ctx context.Context, db *sqlx.DB, migrations fs.FS) ([]string, error) {
	files, err := fs.Glob(migrations, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("list migrations: %w", err)
	}
	type migration struct {
		version int
		name    string
	}
	var all []migration
	for _, f := range files {
		v, err := strconv.Atoi(strings.SplitN(path.Base(f), "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("migration %s: name must start with a number and _", f)
		}
		all = append(all, migration{v, f})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].version < all[j].version })

	var applied []string
	err = inTx(ctx, db, func(tx *sqlx.Tx) error {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLock); err != nil {
			return fmt.Errorf("take migration lock: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migration (
			version    INTEGER     PRIMARY KEY,
			name       TEXT        NOT NULL,
			applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
			return fmt.Errorf("create schema_migration: %w", err)
		}
		var done []int
		if err := tx.SelectContext(ctx, &done, `SELECT version FROM schema_migration`); err != nil {
			return fmt.Errorf("read schema_migration: %w", err)
		}
		have := map[int]bool{}
		for _, v := range done {
			have[v] = true
		}
		for _, m := range all {
			if have[m.version] {
				continue
			}
			body, err := fs.ReadFile(migrations, m.name)
			if err != nil {
				return fmt.Errorf("read migration %s: %w", m.name, err)
			}
			if _, err := tx.ExecContext(ctx, string(body)); err != nil {
				return fmt.Errorf("apply migration %s: %w", m.name, err)
			}
			if _, err := tx.ExecContext(ctx,
				`INSERT INTO schema_migration (version, name) VALUES ($1, $2)`, m.version, m.name); err != nil {
				return fmt.Errorf("record migration %s: %w", m.name, err)
			}
			applied = append(applied, m.name)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return applied, nil
}
