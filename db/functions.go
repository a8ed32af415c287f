package db

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"strings"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// functionsDir is the folder of the migrations that holds the functions:
// functions/NAME.sql defines the function NAME, once, with CREATE OR
// REPLACE FUNCTION, and nothing else. It is the one place that function is
// defined: a numbered migration creates none.
//
// Migrate runs a function's file again whenever the function is not as the
// file makes it: it marks each function it makes with a comment naming its
// file and the SHA-256 of the file's text, so a changed file, a function
// dropped by mistake or one never made (a database migrated before the
// functions had files of their own) is made again, and Pending reports the
// file until then. CREATE OR REPLACE keeps the function's owner, its
// grants and anything that depends on it. A file that changes the
// function's parameters makes a new function beside the old one: Migrate
// then drops the old one (without CASCADE, so an object that depends on it
// stops the migration), and the new one has the default privileges (the
// ones Grant sets reach it). A change CREATE OR REPLACE refuses (the return
// type, a parameter's name) needs a numbered migration that drops the
// function first.
const functionsDir = "functions"

// function is one functions/NAME.sql file.
type function struct {
	name string // the function's, and the file's without .sql
	file string // functions/NAME.sql
	text string
	mark string // the comment Migrate sets on the function: the file and its text's SHA-256
	// early: the file begins with earlyMark. Such a function names no
	// table that must exist when it is made (a LANGUAGE sql body names
	// none; a plpgsql body, resolved only when it runs, may: a trigger's
	// function), so Migrate makes it before the numbered migrations,
	// which may call it or make a trigger of it; it calls only early
	// functions.
	early bool
}

// earlyMark begins the file of a function that the numbered migrations
// may call (function.early).
const earlyMark = "-- Made before the numbered migrations, which may call it."

var lineComment = regexp.MustCompile(`--[^\n]*`)

// functions returns the function files in migrations in an order safe to
// apply them in: each after the functions its text calls (NAME( outside
// comments), by name otherwise. PostgreSQL checks a LANGUAGE sql body when
// the function is made, so the functions it calls must exist then; a
// plpgsql body is resolved only when it runs, so a cycle between plpgsql
// functions is broken wherever it is found.
func functions(migrations fs.FS) ([]function, error) {
	files, err := fs.Glob(migrations, functionsDir+"/*.sql")
	if err != nil {
		return nil, fmt.Errorf("list functions: %w", err)
	}
	byName := map[string]function{}
	var names []string
	for _, f := range files {
		b, err := fs.ReadFile(migrations, f)
		if err != nil {
			return nil, fmt.Errorf("read function %s: %w", f, err)
		}
		name := strings.TrimSuffix(path.Base(f), ".sql")
		byName[name] = function{name: name, file: f, text: string(b), mark: fmt.Sprintf("%s sha256:%x", f, sha256.Sum256(b)),
			early: strings.HasPrefix(string(b), earlyMark)}
		names = append(names, name)
	}
	var order []function
	var calls []string // an early function's calls of one that is not
	seen := map[string]bool{}
	var visit func(string)
	visit = func(n string) {
		if seen[n] {
			return
		}
		seen[n] = true
		code := lineComment.ReplaceAllString(byName[n].text, "")
		for _, m := range names {
			if m != n && regexp.MustCompile(`\b`+regexp.QuoteMeta(m)+`\s*\(`).MatchString(code) {
				if byName[n].early && !byName[m].early {
					calls = append(calls, fmt.Sprintf("%s calls %s", byName[n].file, byName[m].file))
				}
				visit(m)
			}
		}
		order = append(order, byName[n])
	}
	for _, n := range names {
		visit(n)
	}
	if len(calls) > 0 {
		return nil, fmt.Errorf("a function made before the migrations calls one made after them: %s", strings.Join(calls, "; "))
	}
	return order, nil
}

// staleSQL selects, in order, the files of $1 (names), $2 (files), $3
// (marks) whose function in the current schema is missing, not the only
// one of its name, or not marked as made by that file's text. It only
// reads the catalogs, which every role may.
const staleSQL = `SELECT f.file FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS f(name, file, mark, n)
	WHERE (SELECT count(*) = 1 AND bool_and(obj_description(p.oid, 'pg_proc') IS NOT DISTINCT FROM f.mark)
		FROM pg_proc p
		WHERE p.proname = f.name AND p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())) IS NOT TRUE
	ORDER BY f.n`

// staleArgs are staleSQL's arguments for fns.
func staleArgs(fns []function) []any {
	var names, files, marks pq.StringArray
	for _, f := range fns {
		names, files, marks = append(names, f.name), append(files, f.file), append(marks, f.mark)
	}
	return []any{names, files, marks}
}

// staleFunctions returns the functions of fns that are not as their files
// make them, in fns' order.
func staleFunctions(ctx context.Context, tx *sqlx.Tx, fns []function) ([]function, error) {
	var files pq.StringArray
	if err := tx.GetContext(ctx, &files, `SELECT array(`+staleSQL+`)`, staleArgs(fns)...); err != nil {
		return nil, fmt.Errorf("compare the functions with their files: %w", err)
	}
	var stale []function
	for _, f := range fns {
		for _, s := range files {
			if s == f.file {
				stale = append(stale, f)
			}
		}
	}
	return stale, nil
}

// applyFunction runs f's file in tx, drops the other functions of its name
// that it left (an old signature), and marks the one it made.
func applyFunction(ctx context.Context, tx *sqlx.Tx, f function) error {
	if _, err := tx.ExecContext(ctx, f.text); err != nil {
		return fmt.Errorf("apply function %s: %w", f.file, err)
	}
	var found []struct {
		Sig  string `db:"sig"`
		Made bool   `db:"made"`
	}
	// A function this transaction made or replaced is the row it wrote.
	if err := tx.SelectContext(ctx, &found, `SELECT p.oid::regprocedure::text AS sig, p.xmin = pg_current_xact_id()::xid AS made
		FROM pg_proc p
		WHERE p.proname = $1 AND p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())`, f.name); err != nil {
		return fmt.Errorf("apply function %s: find what it made: %w", f.file, err)
	}
	var made, old []string
	for _, p := range found {
		if p.Made {
			made = append(made, p.Sig)
		} else {
			old = append(old, p.Sig)
		}
	}
	if len(made) != 1 {
		return fmt.Errorf("apply function %s: it must make function %s, once; it made %d of that name in the current schema",
			f.file, f.name, len(made))
	}
	for _, sig := range old {
		if _, err := tx.ExecContext(ctx, `DROP FUNCTION `+sig); err != nil {
			return fmt.Errorf("apply function %s: drop the old %s: %w", f.file, sig, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `COMMENT ON FUNCTION `+made[0]+` IS `+pq.QuoteLiteral(f.mark)); err != nil {
		return fmt.Errorf("apply function %s: mark it: %w", f.file, err)
	}
	return nil
}
