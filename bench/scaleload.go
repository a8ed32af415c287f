package main

import (
	"database/sql"
	"fmt"
	"os"
	"strings"
	"time"
)

// loadResult is what prefilling one database took and made.
type loadResult struct {
	Rows      int `json:"inbox_rows"`
	Transfers int `json:"transfers"`
	// Inbox rows whose processed_at is older than INBOX_TTL: what the
	// measured prune removes.
	Expired int64 `json:"inbox_rows_older_than_ttl"`
	// Seconds of each step: the inbox rows, the transfers, the balances
	// they make, building the indexes, VACUUM ANALYZE, CHECKPOINT.
	InboxSeconds      float64 `json:"inbox_seconds"`
	TransfersSeconds  float64 `json:"transfers_seconds"`
	BalancesSeconds   float64 `json:"balances_seconds"`
	IndexSeconds      float64 `json:"index_seconds"`
	VacuumSeconds     float64 `json:"vacuum_analyze_seconds"`
	CheckpointSeconds float64 `json:"checkpoint_seconds"`
	TotalSeconds      float64 `json:"total_seconds"`
	// Sizes after the load, in bytes: each table with its indexes, and the
	// database.
	InboxBytes    int64            `json:"inbox_bytes"`
	TransferBytes int64            `json:"transfer_bytes"`
	DatabaseBytes int64            `json:"database_bytes"`
	IndexBytes    map[string]int64 `json:"index_bytes"`
}

// savedIndex is an index of a prefilled table, dropped before the load and
// built again after it from its own definition, so that the benchmark
// follows whatever the migrations made.
type savedIndex struct {
	table, name string
	constraint  string // a primary key's or unique constraint's definition, else ""
	def         string // CREATE INDEX ..., when not a constraint's
	random      bool   // its first key is not a timestamp (nor a time-ordered id): keys arrive anywhere in it
}

// prefill loads rows inbox rows and transfers transfers into a database the
// service has migrated, as if the service had applied them over time: the
// indexes are dropped first and built after the load, then VACUUM ANALYZE
// and CHECKPOINT. Inbox rows have random v4 event ids (time-ordered ones,
// from processed_at, with timeOrderedIDs; the transfers' ids likewise from
// created_at) and a processed_at
// spread evenly, in insertion order, over a span ending now, of which the
// oldest fraction expired lies beyond ttl; half are TransferCreated, 45%
// TransferCompleted, 5% TransferFailed.
// Transfers are spread over the last year over accounts accounts (named as
// the backlog names them), each paying a random other account a random
// amount as the backlog's do (so that transfer_intent holds what the
// service would have written), 10% still created, 85% completed, 5% failed, with
// the balances they make. buildFill, when not 0, is the fillfactor the
// indexes whose keys arrive at random are built with (then reset to the
// default for the inserts that follow): such an index grown by inserts has
// leaves about 70% full, one built by CREATE INDEX 90%.
func prefill(db *sql.DB, rows, transfers, accounts int, ttl time.Duration, expired float64, buildFill int) (loadResult, error) {
	res := loadResult{Rows: rows, Transfers: transfers}
	start := time.Now()
	step := func(what string, into *float64, f func() error) error {
		t0 := time.Now()
		if err := f(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		*into = time.Since(t0).Seconds()
		fmt.Fprintf(os.Stderr, "scale: %s: %.0f s\n", what, *into)
		return nil
	}
	conn, err := db.Conn(bg)
	if err != nil {
		return res, err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(bg, `SET maintenance_work_mem = '1GB'`); err != nil {
		return res, err
	}
	saved, err := saveIndexes(db, "processed_event", "transfer")
	if err != nil {
		return res, err
	}
	for _, ix := range saved {
		q := "DROP INDEX " + ix.name
		if ix.constraint != "" {
			q = fmt.Sprintf("ALTER TABLE %s DROP CONSTRAINT %s", ix.table, ix.name)
		}
		if _, err := conn.ExecContext(bg, q); err != nil {
			return res, fmt.Errorf("%s: %w", q, err)
		}
	}
	const chunk = 1_000_000 // a statement each, to show progress
	span := ttl.Seconds() / (1 - expired)
	if err := step(fmt.Sprintf("%d inbox rows", rows), &res.InboxSeconds, func() error {
		for lo := 0; lo < rows; lo += chunk {
			hi := min(lo+chunk, rows) - 1
			if _, err := conn.ExecContext(bg, `
				INSERT INTO processed_event (event_id, event_type, processed_at, fingerprint)
				SELECT `+uuidAt("at")+`,
				       CASE WHEN i % 2 = 0 THEN 'TransferCreated' WHEN i % 20 = 19 THEN 'TransferFailed' ELSE 'TransferCompleted' END,
				       at, sha256(int8send(i))
				FROM (SELECT i, now() - make_interval(secs => $3) + make_interval(secs => $3 * i / $4::float8) AS at
				      FROM generate_series($1::bigint, $2::bigint) i) s`, lo, hi, span, rows); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return res, err
	}
	const year = 365 * 24 * 3600.0
	if err := step(fmt.Sprintf("%d transfers", transfers), &res.TransfersSeconds, func() error {
		for lo := 0; lo < transfers; lo += chunk {
			hi := min(lo+chunk, transfers) - 1
			if _, err := conn.ExecContext(bg, `
				INSERT INTO transfer (transfer_id, from_account, to_account, amount_minor, currency, state,
				                      created_event_id, created_at, updated_at)
				SELECT `+uuidAt("at")+`,
				       'acc_' || lpad((i % $3)::text, 5, '0'),
				       'acc_' || lpad(((i % $3 + 1 + floor(random() * ($3 - 1))::bigint) % $3)::text, 5, '0'),
				       1 + floor(random() * 100000)::bigint, 'EUR',
				       CASE WHEN i % 20 < 2 THEN 'created' WHEN i % 20 = 19 THEN 'failed' ELSE 'completed' END,
				       `+uuidAt("at")+`, at,
				       at + CASE WHEN i % 20 < 2 THEN interval '0' ELSE interval '2 seconds' END
				FROM (SELECT i, now() - make_interval(secs => $4) + make_interval(secs => $4 * i / $5::float8) AS at
				      FROM generate_series($1::bigint, $2::bigint) i) s`, lo, hi, accounts, year, transfers); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return res, err
	}
	if err := step("balances", &res.BalancesSeconds, func() error {
		_, err := conn.ExecContext(bg, `
			INSERT INTO balance_projection (account, balance_minor)
			SELECT account, sum(delta) FROM (
			    SELECT from_account AS account, CASE WHEN state = 'failed' THEN 0 ELSE -amount_minor END AS delta FROM transfer
			    UNION ALL
			    SELECT to_account, CASE WHEN state = 'failed' THEN 0 ELSE amount_minor END FROM transfer) m
			GROUP BY account`)
		return err
	}); err != nil {
		return res, err
	}
	if err := step("indexes", &res.IndexSeconds, func() error {
		for _, ix := range saved {
			with := ""
			if buildFill > 0 && ix.random && !strings.Contains(ix.def, " WHERE ") && !strings.Contains(ix.constraint, " WHERE ") {
				with = fmt.Sprintf(" WITH (fillfactor = %d)", buildFill)
			}
			q := ix.def + with
			if ix.constraint != "" {
				q = fmt.Sprintf("ALTER TABLE %s ADD CONSTRAINT %s %s%s", ix.table, ix.name, ix.constraint, with)
			}
			if _, err := conn.ExecContext(bg, q); err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
			if with != "" {
				if _, err := conn.ExecContext(bg, "ALTER INDEX "+ix.name+" RESET (fillfactor)"); err != nil {
					return err
				}
			}
			// A BRIN index as sql/0016 leaves it: the range being
			// filled without a summary, which each insert would widen.
			if strings.Contains(ix.def, " USING brin ") {
				if _, err := conn.ExecContext(bg, `SELECT brin_desummarize_range($1::regclass,
					greatest(pg_relation_size($2::regclass) / current_setting('block_size')::int - 1, 0))`, ix.name, ix.table); err != nil {
					return err
				}
			}
		}
		return nil
	}); err != nil {
		return res, err
	}
	if err := step("VACUUM ANALYZE", &res.VacuumSeconds, func() error {
		_, err := conn.ExecContext(bg, `VACUUM ANALYZE`)
		return err
	}); err != nil {
		return res, err
	}
	if err := step("CHECKPOINT", &res.CheckpointSeconds, func() error {
		_, err := conn.ExecContext(bg, `CHECKPOINT`)
		return err
	}); err != nil {
		return res, err
	}
	res.TotalSeconds = time.Since(start).Seconds()
	if err := db.QueryRow(`SELECT count(*) FROM processed_event WHERE processed_at < now() - make_interval(secs => $1)`,
		ttl.Seconds()).Scan(&res.Expired); err != nil {
		return res, err
	}
	// A partitioned table has no storage of its own: its size is its
	// partitions'.
	if err := db.QueryRow(`SELECT (SELECT sum(pg_total_relation_size(relid))::bigint FROM pg_partition_tree('processed_event')),
		pg_total_relation_size('transfer'),
		pg_database_size(current_database())`).Scan(&res.InboxBytes, &res.TransferBytes, &res.DatabaseBytes); err != nil {
		return res, err
	}
	res.IndexBytes = map[string]int64{}
	for _, ix := range saved {
		var n int64
		if err := db.QueryRow(`SELECT pg_relation_size($1::regclass)`, ix.name).Scan(&n); err != nil {
			return res, err
		}
		res.IndexBytes[ix.name] = n
	}
	return res, nil
}

// uuidAt is the SQL for a new id made at the time the expression at
// names: random (version 4), or, with timeOrderedIDs, that time's Unix
// milliseconds in the first 48 bits and version 7's layout.
func uuidAt(at string) string {
	if !timeOrderedIDs {
		return "gen_random_uuid()"
	}
	return "(lpad(to_hex((extract(epoch FROM " + at + ") * 1000)::bigint), 12, '0') || '7' || " +
		"substr(replace(gen_random_uuid()::text, '-', ''), 14))::uuid"
}

// saveIndexes reads the definitions of the indexes of tables.
func saveIndexes(db *sql.DB, tables ...string) ([]savedIndex, error) {
	var out []savedIndex
	for _, t := range tables {
		rs, err := db.Query(`
			SELECT c.relname, coalesce(pg_get_constraintdef(con.oid), ''), pg_get_indexdef(i.indexrelid),
			       coalesce(format_type(a.atttypid, a.atttypmod) NOT LIKE 'timestamp%', true)
			           AND NOT ($2 AND a.atttypid = 'uuid'::regtype)
			FROM pg_index i
			JOIN pg_class c ON c.oid = i.indexrelid
			LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
			LEFT JOIN pg_constraint con ON con.conindid = i.indexrelid AND con.conrelid = i.indrelid AND con.contype IN ('p', 'u')
			WHERE i.indrelid = $1::regclass
			ORDER BY i.indisprimary DESC, c.relname`, t, timeOrderedIDs)
		if err != nil {
			return nil, err
		}
		for rs.Next() {
			ix := savedIndex{table: t}
			if err := rs.Scan(&ix.name, &ix.constraint, &ix.def, &ix.random); err != nil {
				rs.Close()
				return nil, err
			}
			// A partitioned table's index reads "ON ONLY table", which
			// would make the parent's index alone, invalid, and none on
			// the partitions: made again, it must cascade to them.
			ix.def = strings.Replace(ix.def, " ON ONLY ", " ON ", 1)
			out = append(out, ix)
		}
		rs.Close()
		if err := rs.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}
