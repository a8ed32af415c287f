package reconcile

import (
	"context"
	"database/sql"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"transferconsumer/db"
)

// Whether a pass may start from the checkpoint (adr/0007, "When the
// checkpoint is not trusted").

// A checkpoint copied rather than written here (COPY FROM, as pg_restore
// writes a table, here into the same database), or whose transfers are
// gone, or that a person marked, or that was deleted, is not trusted: the
// next pass is a full one, which finds what the periodic pass would have
// missed, and makes it anew. It compares the transfers with a checkpoint
// that means something here (a marked one), not with one copied. A
// standby's claim, or a person's mark, made on a copied checkpoint does
// not make it look written here. What a restore into another cluster, a
// failover or a logical replica does is tested on clusters of their own
// (integration, TestReconcile…).
func TestACheckpointFromBeforeARestoreIsNotTrusted(t *testing.T) {
	database := testDB(t, 4)
	l := newLedger(t, database)
	for _, tc := range []struct {
		name     string
		edit     func()
		why      string
		compared bool
	}{
		{"copied", func() {
			copyBack(t, database, "reconcile_checkpoint")
			if err := ReleaseFull(context.Background(), database); err != nil {
				t.Fatal(err)
			}
			database.MustExec(`UPDATE reconcile_checkpoint SET full_claimed_until = now() + interval '1 hour'`)
		}, "copied", false},
		{"transfers gone", func() {
			database.MustExec(`DELETE FROM transfer WHERE transfer_id = (SELECT witness_ids[1] FROM reconcile_checkpoint)`)
		}, "transfers it holds are gone", false},
		{"marked", func() { database.MustExec(`UPDATE reconcile_checkpoint SET distrust = 'by hand'`) }, "by hand", true},
		{"deleted", func() { database.MustExec(`UPDATE reconcile_checkpoint SET cutoff = NULL`) }, "there is none", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l.create(0, 1, 5)
			pass(t, database, periodic)
			l.create(1, 0, 2)
			if r := pass(t, database, periodic); r.Full {
				t.Fatalf("a pass from a checkpoint made by the one before was a full one: %+v", r.Checkpoint)
			}
			tc.edit()
			// What a periodic pass from it would not see: a balance the
			// transfers since did not move, changed by hand, beyond the
			// sweep's share.
			database.MustExec(`UPDATE balance_projection SET balance_minor = balance_minor - 3 WHERE account = $1`, l.account(0))
			r := pass(t, database, PeriodicOptions{Options: periodic.Options, Sweep: 1})
			why := r.Checkpoint.Broken + r.Checkpoint.Distrusted
			if !r.Full || !r.Checkpoint.Rebuilt || !strings.Contains(why, tc.why) || r.Checkpoint.Compared != tc.compared || r.DriftCount == 0 {
				t.Errorf("full %v, rebuilt %v, why %q, compared %v, drift %d; want a full pass saying %q, compared %v, and the drift",
					r.Full, r.Checkpoint.Rebuilt, why, r.Checkpoint.Compared, r.DriftCount, tc.why, tc.compared)
			}
			if r := pass(t, database, periodic); r.Full {
				t.Errorf("the pass after the full one: full, %+v; want it to start from the checkpoint made anew", r.Checkpoint)
			}
			// Mended, for the next case: the balance, and a transfer
			// deleted (its accounts' balances follow the transfers left).
			database.MustExec(`UPDATE balance_projection SET balance_minor = balance_minor + 3 WHERE account = $1`, l.account(0))
			database.MustExec(`UPDATE balance_projection b SET balance_minor = n.net_minor FROM reconcile_checkpoint_net n WHERE n.account = b.account`)
			if r := pass(t, database, PeriodicOptions{Options: periodic.Options, Full: true}); r.DriftCount != 0 {
				t.Fatalf("not mended: %+v", r.Drift)
			}
		})
	}
}

// copyBack copies every row of table out and back in with COPY FROM
// STDIN, in one transaction, as pg_restore writes a table: the same
// values, written by another transaction. (lib/pq has no COPY TO: the
// rows are read as text, which is COPY's text format.)
func copyBack(t *testing.T, database *sqlx.DB, table string) {
	t.Helper()
	var cols []string
	if err := database.Select(&cols, `SELECT attname FROM pg_attribute
		WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, table); err != nil {
		t.Fatal(err)
	}
	quoted := make([]string, len(cols))
	text := make([]string, len(cols))
	for i, c := range cols {
		quoted[i] = pq.QuoteIdentifier(c)
		text[i] = quoted[i] + "::text"
	}
	rows, err := database.Query(`SELECT ` + strings.Join(text, ", ") + ` FROM ` + pq.QuoteIdentifier(table))
	if err != nil {
		t.Fatal(err)
	}
	var all [][]any
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		row := make([]any, len(cols))
		for i, v := range vals {
			if v.Valid {
				row[i] = v.String
			}
		}
		all = append(all, row)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	tx := database.MustBegin()
	defer tx.Rollback()
	tx.MustExec(`DELETE FROM ` + pq.QuoteIdentifier(table))
	stmt, err := tx.Prepare(`COPY ` + pq.QuoteIdentifier(table) + ` (` + strings.Join(quoted, ", ") + `) FROM STDIN`)
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range all {
		if _, err := stmt.Exec(row...); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := stmt.Exec(); err != nil {
		t.Fatal(err)
	}
	if err := stmt.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// migrationsUpTo is ../sql without the numbered migrations above top: the
// schema a release before this one made (with this release's functions,
// which need the columns of every migration up to sql/0018).
func migrationsUpTo(t *testing.T, top int) fs.FS {
	t.Helper()
	all := os.DirFS("../sql")
	out := fstest.MapFS{}
	err := fs.WalkDir(all, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if v, err := strconv.Atoi(strings.SplitN(path.Base(p), "_", 2)[0]); err == nil && path.Dir(p) == "." && v > top {
			return nil
		}
		b, err := fs.ReadFile(all, p)
		out[p] = &fstest.MapFile{Data: b}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// The checkpoint the release before sql/0019 wrote, as it left it after a
// standby's claim (which did not stamp it), is kept by the upgrade when
// that release's own checks hold: the next pass starts from it. One that
// came from another cluster is not: the next pass is a full one.
func TestTheUpgradeKeepsTheCheckpointOfTheReleaseBefore(t *testing.T) {
	for _, tc := range []struct {
		name   string
		system string
		full   bool
	}{
		{"written in this cluster", "(SELECT system_identifier FROM pg_control_system())", false},
		{"restored from another cluster", "(SELECT system_identifier FROM pg_control_system()) + 1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			database := testDBWith(t, 4, migrationsUpTo(t, 18))
			l := newLedger(t, database)
			l.create(0, 1, 10)
			l.fail(l.create(1, 2, 4))
			// What that release's full pass wrote: the nets, its cut-off,
			// the cluster and its transaction; then a claim, by another.
			database.MustExec(`INSERT INTO reconcile_checkpoint_net SELECT account, balance_minor FROM balance_projection`)
			database.MustExec(`UPDATE reconcile_checkpoint SET cutoff = pg_current_snapshot(), system_identifier = ` + tc.system + `,
				written_by = pg_current_xact_id(), written_at = now(), witness_ids = '{}', witness_xids = '{}', rebuilt_at = now(), full_at = now()`)
			database.MustExec(`UPDATE reconcile_checkpoint SET full_claimed_until = now() + interval '1 day'`)
			if _, err := db.Migrate(context.Background(), database, os.DirFS("../sql")); err != nil {
				t.Fatal(err)
			}
			l.create(2, 0, 3)
			r := pass(t, database, periodic)
			if r.Full != tc.full || r.DriftCount != 0 || tc.full && !strings.Contains(r.Checkpoint.Broken, "copied") {
				t.Errorf("the first pass after the upgrade: full %v, drift %+v, broken %q; want full %v, clean", r.Full, r.Drift, r.Checkpoint.Broken, tc.full)
			}
			if r := pass(t, database, periodic); r.Full || r.DriftCount != 0 {
				t.Errorf("the pass after: full %v, drift %+v; want a periodic pass, clean", r.Full, r.Drift)
			}
		})
	}
}
