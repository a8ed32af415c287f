package db

import (
	"context"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
)

// Grant gives role what the service needs to run on the schema the
// migrations made, now and after every later migration, and nothing that
// would let it change the schema:
//
//   - CONNECT on the database and USAGE on the schema (an estate may have
//     revoked both from PUBLIC);
//   - SELECT, INSERT, UPDATE and DELETE on every table of the schema, but
//     only SELECT on schema_migration: the service reads it to check the
//     schema is current, and never writes it unless it migrates;
//   - USAGE on every sequence (a BIGSERIAL's nextval);
//   - EXECUTE on every function: PostgreSQL grants it to PUBLIC by default,
//     but an estate that revoked that (ALTER DEFAULT PRIVILEGES … REVOKE
//     EXECUTE ON FUNCTIONS FROM PUBLIC) would leave the service unable to
//     call apply_event;
//   - the same on the tables, sequences and functions that later
//     migrations create, through ALTER DEFAULT PRIVILEGES FOR ROLE the
//     current user: grants on existing objects do not reach new ones, and
//     a migration that drops and creates a function again makes a new one.
//     Later migrations must then be run by the same role as this one.
//
// The schema is the current one (the first of search_path that exists),
// where Migrate creates its tables. It runs in one transaction and may be
// run again: grants are idempotent.
func Grant(ctx context.Context, db *sqlx.DB, role string) error {
	if role == "" {
		return errors.New("grant: no role named")
	}
	r := pq.QuoteIdentifier(role)
	return inTx(ctx, db, func(tx *sqlx.Tx) error {
		var schema, owner, database *string
		if err := tx.QueryRowxContext(ctx, `SELECT current_schema(), current_user, current_database()`).
			Scan(&schema, &owner, &database); err != nil {
			return fmt.Errorf("grant: %w", err)
		}
		if schema == nil {
			return errors.New("grant: no schema of search_path exists; migrate first")
		}
		if role == *owner {
			// Its own grants are the owner's whole rights: the REVOKE
			// below would take from it the right to record a migration.
			return fmt.Errorf("grant: %s is the role migrating; name the service's own role", role)
		}
		s, o := pq.QuoteIdentifier(*schema), pq.QuoteIdentifier(*owner)
		var hasMigrations bool
		if err := tx.GetContext(ctx, &hasMigrations, `SELECT to_regclass('schema_migration') IS NOT NULL`); err != nil {
			return fmt.Errorf("grant: %w", err)
		}
		stmts := []string{
			"GRANT CONNECT ON DATABASE " + pq.QuoteIdentifier(*database) + " TO " + r,
			"GRANT USAGE ON SCHEMA " + s + " TO " + r,
			"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA " + s + " TO " + r,
			"GRANT USAGE ON ALL SEQUENCES IN SCHEMA " + s + " TO " + r,
			"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA " + s + " TO " + r,
			"ALTER DEFAULT PRIVILEGES FOR ROLE " + o + " IN SCHEMA " + s + " GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO " + r,
			"ALTER DEFAULT PRIVILEGES FOR ROLE " + o + " IN SCHEMA " + s + " GRANT USAGE ON SEQUENCES TO " + r,
			"ALTER DEFAULT PRIVILEGES FOR ROLE " + o + " IN SCHEMA " + s + " GRANT EXECUTE ON FUNCTIONS TO " + r,
		}
		if hasMigrations {
			stmts = append(stmts, "REVOKE INSERT, UPDATE, DELETE ON TABLE "+s+".schema_migration FROM "+r)
		}
		for _, stmt := range stmts {
			if _, err := tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("grant to %s: %s: %w", role, stmt, err)
			}
		}
		return nil
	})
}
