package db

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// migrationLock is the advisory lock key that serialises migrations, so two
// replicas starting at once apply each migration exactly once.
const migrationLock = 7_301_001

// migration is one NNNN_name.sql file.
type migration struct {
	version int
	name    string
}

// list returns the migrations in migrations, in the order of their numbers.
func list(migrations fs.FS) ([]migration, error) {
	files, err := fs.Glob(migrations, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("list migrations: %w", err)
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
	return all, nil
}

// newer reports whether done records a migration numbered above every one
// in all: the schema was migrated by a later release. Its functions are
// then that release's, made for its tables, and a binary of this release
// (one still running, or restarted, during a rolling deploy) must not put
// its own back: it leaves them as they are, and runs on them, since a
// release keeps its functions' signatures or migrates the old ones away.
func newer(all []migration, done []int) bool {
	top := 0
	for _, m := range all {
		top = max(top, m.version)
	}
	for _, v := range done {
		if v > top {
			return true
		}
	}
	return false
}

// missing returns the names of the migrations of all whose versions are not
// in done.
func missing(all []migration, done []int) []string {
	have := map[int]bool{}
	for _, v := range done {
		have[v] = true
	}
	var out []string
	for _, m := range all {
		if !have[m.version] {
			out = append(out, m.name)
		}
	}
	return out
}

// Pending returns the names of the migrations in migrations that the
// database has not recorded, in order, then the function files whose
// functions are not as the files make them (see functionsDir); none when
// the schema is current. It only reads (SELECT on schema_migration, and
// the catalogs, is all it needs), so a role that may not change the schema
// can ask. A database without schema_migration has every migration
// pending. A failure to read is returned as it is: a
// 42501 there means the role may not even read schema_migration.
func Pending(ctx context.Context, db *sqlx.DB, migrations fs.FS) ([]string, error) {
	missing, _, err := pending(ctx, db, migrations)
	return missing, err
}

// Migrate applies, in order, every NNNN_name.sql file in migrations that the
// database has not recorded yet, then (unless a later release migrated the
// schema, see newer) every function file
// (functions/NAME.sql, see functions) whose function is not as the file
// makes it, all in one transaction under an advisory lock: a replica that
// starts at the same moment waits, then finds nothing left to do. It
// returns the names of the files it applied. It needs CREATE on the
// schema, even with nothing to apply: a role that may not is refused with
// 42501 (see Refused), and should ask Pending instead.
//
// The numbered migrations are recorded in schema_migration by version, and
// run once each; a function file is run again whenever its text changes,
// since each function's definition lives in that one file. The numbered
// migrations run first, so the functions find the tables they name; they
// may call only the functions made before them, which name no table (a
// file that begins with earlyMark, see function.early).
func Migrate(ctx context.Context, db *sqlx.DB, migrations fs.FS) ([]string, error) {
	all, err := list(migrations)
	if err != nil {
		return nil, err
	}
	fns, err := functions(migrations)
	if err != nil {
		return nil, err
	}
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
		byName := map[string]migration{}
		for _, m := range all {
			byName[m.name] = m
		}
		todo := missing(all, done)
		if len(todo) > 0 && !newer(all, done) {
			files, err := applyStale(ctx, tx, earlyOnes(fns))
			if err != nil {
				return err
			}
			applied = append(applied, files...)
		}
		for _, name := range todo {
			m := byName[name]
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
		if newer(all, done) {
			return nil
		}
		files, err := applyStale(ctx, tx, fns)
		applied = append(applied, files...)
		return err
	})
	if err != nil {
		return nil, err
	}
	return applied, nil
}

// applyStale applies the functions of fns that are not as their files make
// them, in fns' order, and returns their files.
func applyStale(ctx context.Context, tx *sqlx.Tx, fns []function) ([]string, error) {
	stale, err := staleFunctions(ctx, tx, fns)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, f := range stale {
		if err := applyFunction(ctx, tx, f); err != nil {
			return files, err
		}
		files = append(files, f.file)
	}
	return files, nil
}

// earlyOnes returns the functions of fns made before the numbered
// migrations, in fns' order.
func earlyOnes(fns []function) []function {
	var out []function
	for _, f := range fns {
		if f.early {
			out = append(out, f)
		}
	}
	return out
}

// Refused reports whether err is the database refusing the role a
// privilege (42501, insufficient_privilege: no CREATE on the schema, not
// the owner of a table, no SELECT on one). Unlike a lost connection or a
// standby, that does not heal by trying again: someone must grant, or
// someone else must do it.
func Refused(err error) bool {
	var pqErr *pq.Error
	return errors.As(err, &pqErr) && pqErr.Code == "42501"
}
