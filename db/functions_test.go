package db

import (
	"archive/zip"
	"context"
	"io/fs"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jmoiron/sqlx"

	"transferconsumer/dbtest"
	"transferconsumer/event"
)

// everyFile returns what Migrate applies to an empty database from
// migrations, in its order: the numbered migrations, then the functions.
func everyFile(t testing.TB, migrations fs.FS) []string {
	t.Helper()
	all, err := list(migrations)
	if err != nil {
		t.Fatal(err)
	}
	fns, err := functions(migrations)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range all {
		out = append(out, m.name)
	}
	for _, f := range fns {
		out = append(out, f.file)
	}
	return out
}

var (
	createFunction = regexp.MustCompile(`(?i)\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE)\s+([a-z_][a-z0-9_]*)`)
	dollarBody     = regexp.MustCompile(`(?s)\$\$(.*?)\$\$`)
)

// Each function is defined in one file, sql/functions/NAME.sql, which
// defines it alone; no numbered migration defines one, and no function
// body appears in two files.
func TestEachFunctionIsDefinedOnceInItsOwnFile(t *testing.T) {
	sqlDir := os.DirFS("../sql")
	bodies := map[string]string{} // body → the file it was first seen in
	defined := map[string][]string{}
	err := fs.WalkDir(sqlDir, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".sql") {
			return err
		}
		b, err := fs.ReadFile(sqlDir, p)
		if err != nil {
			return err
		}
		code := lineComment.ReplaceAllString(string(b), "")
		for _, m := range createFunction.FindAllStringSubmatch(code, -1) {
			defined[strings.ToLower(m[1])] = append(defined[strings.ToLower(m[1])], p)
		}
		for _, m := range dollarBody.FindAllStringSubmatch(code, -1) {
			body := strings.TrimSpace(m[1])
			if first, ok := bodies[body]; ok && first != p {
				t.Errorf("a function body appears in %s and %s", first, p)
			}
			bodies[body] = p
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, files := range defined {
		if want := functionsDir + "/" + name + ".sql"; len(files) != 1 || files[0] != want {
			t.Errorf("function %s is defined in %v, want in %s alone", name, files, want)
		}
	}
	fns, err := functions(sqlDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(fns) == 0 {
		t.Fatal("no function files in ../sql/functions")
	}
	for _, f := range fns {
		if files := defined[f.name]; len(files) != 1 {
			t.Errorf("%s defines %s %d times, want once", f.file, f.name, len(files))
		}
		for name, files := range defined {
			if name != f.name && slices.Contains(files, f.file) {
				t.Errorf("%s defines %s too: one function a file", f.file, name)
			}
		}
	}
}

// Functions are applied after the functions they call: a LANGUAGE sql
// body is checked when it is made.
func TestFunctionsComeAfterTheFunctionsTheyCall(t *testing.T) {
	fns, err := functions(os.DirFS("../sql"))
	if err != nil {
		t.Fatal(err)
	}
	at := map[string]int{}
	for i, f := range fns {
		at[f.name] = i
	}
	for _, pair := range [][2]string{{"move_balances", "set_transfer_state"}, {"set_transfer_state", "apply_effect"},
		{"apply_effect", "apply_event"}, {"claim_taken", "apply_event"}, {"pin_transaction", "apply_event"},
		{"apply_effect", "apply_batch"}, {"claim_taken", "apply_batch"}, {"pin_transaction", "apply_batch"}} {
		if at[pair[0]] >= at[pair[1]] {
			t.Errorf("%s comes after %s, which calls it: %v", pair[0], pair[1], at)
		}
	}
	// A cycle, as plpgsql allows, is broken, not refused.
	cyc := fstest.MapFS{
		"functions/a.sql": {Data: []byte("CREATE OR REPLACE FUNCTION a() RETURNS int LANGUAGE plpgsql AS $$ BEGIN RETURN b(); END $$;")},
		"functions/b.sql": {Data: []byte("CREATE OR REPLACE FUNCTION b() RETURNS int LANGUAGE plpgsql AS $$ BEGIN RETURN a(); END $$;")},
		"functions/c.sql": {Data: []byte("-- not a(), which a comment names\nCREATE OR REPLACE FUNCTION c() RETURNS int LANGUAGE sql AS 'SELECT 1';")},
	}
	if fns, err := functions(cyc); err != nil || len(fns) != 3 || fns[0].name != "b" || fns[2].name != "c" {
		t.Errorf("functions of a cycle = %v, %v", fns, err)
	}
}

// functionDefs returns pg_get_functiondef of every function in the
// current schema, by signature, and their comments.
func functionDefs(t *testing.T, database *sqlx.DB) (map[string]string, map[string]string) {
	t.Helper()
	var rows []struct {
		Sig, Def, Mark string
	}
	if err := database.Select(&rows, `SELECT p.oid::regprocedure::text AS sig, pg_get_functiondef(p.oid) AS def,
		coalesce(obj_description(p.oid, 'pg_proc'), '') AS mark
		FROM pg_proc p WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())`); err != nil {
		t.Fatal(err)
	}
	defs, marks := map[string]string{}, map[string]string{}
	for _, r := range rows {
		defs[r.Sig], marks[r.Sig] = r.Def, r.Mark
	}
	return defs, marks
}

// A database that the migrations as they were before the functions had
// files of their own made (ten numbered migrations, the functions among
// them) is upgraded by the numbered migrations written since and the
// function files: none of its ten runs again, the functions end as on a
// new database, and the service's role, which may not migrate, is told the
// schema is behind until the owner migrates, then applies events as
// before.
func TestUpgradeFromMigrationsThatDefinedTheFunctions(t *testing.T) {
	ctx := context.Background()
	newSQL := os.DirFS("../sql")
	// The migrations as released at 032e43b, kept packed: a release's
	// artifact, not source that defines the functions a second time.
	owner, role, svc := releasedSchema(t, "testdata/sql-032e43b.zip", true)
	before := newEvent(t, newID(), event.TransferCreated, newID(), "acc_a", "acc_b", 100)
	if _, err := NewInbox(svc).Apply(ctx, before); err != nil {
		t.Fatalf("apply on the old schema: %v", err)
	}

	fns, _ := functions(newSQL)
	// What the upgrade must run: the numbered migrations written since that
	// release (those after its ten), then every function file.
	numbered, err := list(newSQL)
	if err != nil {
		t.Fatal(err)
	}
	var upgrade []string
	for _, m := range numbered {
		if m.version > 10 {
			upgrade = append(upgrade, m.name)
		}
	}
	for _, f := range fns {
		upgrade = append(upgrade, f.file)
	}
	if missing, err := Pending(ctx, svc, newSQL); err != nil || !slices.Equal(missing, upgrade) {
		t.Errorf("Pending as %s before the upgrade = %v, %v, want the later migrations and the function files %v", role, missing, err, upgrade)
	}
	// Migrate makes the functions the migrations may call first.
	var order []string
	for _, f := range fns {
		if f.early {
			order = append(order, f.file)
		}
	}
	for _, name := range upgrade {
		if !slices.Contains(order, name) {
			order = append(order, name)
		}
	}
	applied, err := Migrate(ctx, owner, newSQL)
	if err != nil || !slices.Equal(applied, order) {
		t.Fatalf("the upgrade applied %v, %v, want the functions the migrations call, the later migrations and the other function files %v", applied, err, order)
	}
	var versions int
	owner.Get(&versions, `SELECT count(*) FROM schema_migration`)
	if versions != len(numbered) {
		t.Errorf("schema_migration has %d rows after the upgrade, want one per numbered migration (%d)", versions, len(numbered))
	}
	if applied, err := Migrate(ctx, owner, newSQL); err != nil || len(applied) != 0 {
		t.Errorf("Migrate again = %v, %v, want nothing to do", applied, err)
	}
	if missing, err := Pending(ctx, svc, newSQL); err != nil || len(missing) != 0 {
		t.Errorf("Pending as %s after the upgrade = %v, %v, want none", role, missing, err)
	}

	upgraded, marks := functionDefs(t, owner)
	_, fresh := freshDB(t)
	if _, err := Migrate(ctx, fresh, newSQL); err != nil {
		t.Fatal(err)
	}
	want, freshMarks := functionDefs(t, fresh)
	if len(want) != len(fns) {
		t.Errorf("a new database has %d functions, want one per file (%d): %v", len(want), len(fns), want)
	}
	for sig, def := range want {
		if upgraded[sig] != def {
			t.Errorf("%s after the upgrade:\n%s\nwant, as on a new database:\n%s", sig, upgraded[sig], def)
		}
		if marks[sig] == "" || marks[sig] != freshMarks[sig] {
			t.Errorf("%s is marked %q after the upgrade, %q on a new database", sig, marks[sig], freshMarks[sig])
		}
	}
	for sig := range upgraded {
		if _, ok := want[sig]; !ok {
			t.Errorf("%s is left after the upgrade; a new database has no such function", sig)
		}
	}

	// The role applies, deduplicates and batches on the upgraded schema.
	in := NewInbox(svc)
	if r, err := in.Apply(ctx, before); err != nil || !r.Duplicate {
		t.Errorf("the event applied before the upgrade, again = %+v, %v, want a duplicate", r, err)
	}
	transfer := newID()
	created := newEvent(t, newID(), event.TransferCreated, transfer, "acc_a", "acc_c", 30)
	failed := newEvent(t, newID(), event.TransferFailed, transfer, "acc_a", "acc_c", 30)
	if r, err := in.Apply(ctx, created); err != nil || r.Duplicate {
		t.Errorf("apply after the upgrade = %+v, %v", r, err)
	}
	l := in.Lane(0)
	defer l.Close()
	out, err := l.(*lane).ApplyBatch(ctx, []event.Event{failed, created})
	if err != nil || len(out) != 2 || out[0].Err != nil || out[0].Result.Duplicate || !out[1].Result.Duplicate {
		t.Errorf("a batch after the upgrade = %+v, %v", out, err)
	}
	var balance int64
	owner.Get(&balance, `SELECT balance_minor FROM balance_projection WHERE account = 'acc_a'`)
	if balance != -100 {
		t.Errorf("acc_a's balance %d, want -100 (a failed transfer gives its amount back)", balance)
	}
}

// releasedSchema is a new database migrated, as its owner, with the
// migrations of a release kept packed in zipped (locked down first when
// lock is true), and a service role granted what it needs there: the
// owner's pool, the role's name and its pool.
func releasedSchema(t *testing.T, zipped string, lock bool) (owner *sqlx.DB, role string, svc *sqlx.DB) {
	t.Helper()
	dbURL, owner := freshDB(t)
	if lock {
		dbtest.LockDown(t, owner)
	}
	old, err := zip.OpenReader(zipped)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if _, err := Migrate(context.Background(), owner, old); err != nil {
		t.Fatal(err)
	}
	role, svc = dbtest.ServiceRole(t, dbURL, owner)
	if err := Grant(context.Background(), owner, role); err != nil {
		t.Fatal(err)
	}
	return owner, role, svc
}

// A function file that changes is applied again, alone; one that changes
// its function's parameters leaves no old function behind; a function
// dropped by mistake is made again. The function keeps what its file
// says (SECURITY DEFINER, search_path), and the service's role may still
// execute it.
func TestFunctionFileChangedIsAppliedAgain(t *testing.T) {
	ctx := context.Background()
	dbURL, owner := freshDB(t)
	dbtest.LockDown(t, owner)
	table := []byte(`CREATE TABLE t (v INT);`)
	f := func(sig, body string) *fstest.MapFile {
		return &fstest.MapFile{Data: []byte("-- f\nCREATE OR REPLACE FUNCTION f(" + sig + ") RETURNS INT LANGUAGE sql\n" +
			"SECURITY DEFINER SET search_path = public AS $$ " + body + " $$;")}
	}
	g := &fstest.MapFile{Data: []byte(`CREATE OR REPLACE FUNCTION g() RETURNS INT LANGUAGE sql AS $$ SELECT f(1) $$;`)}
	v1 := fstest.MapFS{"0001_t.sql": {Data: table}, "functions/f.sql": f("a INT", "SELECT a"), "functions/g.sql": g}
	if applied, err := Migrate(ctx, owner, v1); err != nil || strings.Join(applied, " ") != "0001_t.sql functions/f.sql functions/g.sql" {
		t.Fatalf("Migrate = %v, %v", applied, err)
	}
	role, svc := dbtest.ServiceRole(t, dbURL, owner)
	if err := Grant(ctx, owner, role); err != nil {
		t.Fatal(err)
	}

	call := func(db *sqlx.DB, q string) int {
		t.Helper()
		var n int
		if err := db.Get(&n, q); err != nil {
			t.Errorf("%s: %v", q, err)
		}
		return n
	}
	v2 := fstest.MapFS{"0001_t.sql": {Data: table}, "functions/f.sql": f("a INT", "SELECT a + 1"), "functions/g.sql": g}
	if missing, err := Pending(ctx, svc, v2); err != nil || strings.Join(missing, " ") != "functions/f.sql" {
		t.Errorf("Pending with f changed = %v, %v", missing, err)
	}
	if applied, err := Migrate(ctx, owner, v2); err != nil || strings.Join(applied, " ") != "functions/f.sql" {
		t.Fatalf("Migrate with f changed = %v, %v", applied, err)
	}
	if n := call(svc, `SELECT g()`); n != 2 {
		t.Errorf("g() = %d after f changed, want 2", n)
	}

	v3 := fstest.MapFS{"0001_t.sql": {Data: table}, "functions/f.sql": f("a INT, b INT DEFAULT 5", "SELECT a + b"), "functions/g.sql": g}
	if applied, err := Migrate(ctx, owner, v3); err != nil || strings.Join(applied, " ") != "functions/f.sql" {
		t.Fatalf("Migrate with f's parameters changed = %v, %v", applied, err)
	}
	if n := call(svc, `SELECT g()`); n != 6 {
		t.Errorf("g() = %d after f's parameters changed, want 6", n)
	}
	var got []struct {
		Sig    string `db:"sig"`
		Secdef bool   `db:"secdef"`
		Config string `db:"config"`
	}
	owner.Select(&got, `SELECT oid::regprocedure::text AS sig, prosecdef AS secdef, array_to_string(proconfig, ',') AS config
		FROM pg_proc WHERE proname = 'f'`)
	if len(got) != 1 || got[0].Sig != "f(integer,integer)" || !got[0].Secdef || got[0].Config != "search_path=public" {
		t.Errorf("functions named f: %+v, want f(integer,integer) alone, SECURITY DEFINER, search_path=public", got)
	}

	owner.MustExec(`DROP FUNCTION g()`)
	if missing, err := Pending(ctx, svc, v3); err != nil || strings.Join(missing, " ") != "functions/g.sql" {
		t.Errorf("Pending with g dropped = %v, %v", missing, err)
	}
	if applied, err := Migrate(ctx, owner, v3); err != nil || strings.Join(applied, " ") != "functions/g.sql" {
		t.Fatalf("Migrate with g dropped = %v, %v", applied, err)
	}
	if n := call(svc, `SELECT g()`); n != 6 {
		t.Errorf("g() = %d after it was made again, want 6", n)
	}

	// A file must make the function it is named after.
	wrong := fstest.MapFS{"0001_t.sql": {Data: table}, "functions/h.sql": g}
	if _, err := Migrate(ctx, owner, wrong); err == nil || !strings.Contains(err.Error(), "it must make function h, once") {
		t.Errorf("Migrate with functions/h.sql making g = %v", err)
	}
}

// A binary of an earlier release, on a schema a later release migrated
// (a record of a migration numbered above all of its own), leaves that
// release's functions alone: it does not put its own files back, and
// finds nothing pending. On a schema of its own release it does.
func TestAnOlderBinaryLeavesANewerSchemasFunctions(t *testing.T) {
	ctx := context.Background()
	_, owner := freshDB(t)
	table := []byte(`CREATE TABLE t (v INT);`)
	f := func(body string) *fstest.MapFile {
		return &fstest.MapFile{Data: []byte("CREATE OR REPLACE FUNCTION f() RETURNS INT LANGUAGE sql AS $$ " + body + " $$;")}
	}
	newer := fstest.MapFS{"0001_t.sql": {Data: table}, "0002_u.sql": {Data: []byte(`SELECT 1;`)}, "functions/f.sql": f("SELECT 2")}
	older := fstest.MapFS{"0001_t.sql": {Data: table}, "functions/f.sql": f("SELECT 1")}
	if _, err := Migrate(ctx, owner, newer); err != nil {
		t.Fatal(err)
	}
	if missing, err := Pending(ctx, owner, older); err != nil || len(missing) != 0 {
		t.Errorf("Pending for the older release = %v, %v, want none", missing, err)
	}
	if applied, err := Migrate(ctx, owner, older); err != nil || len(applied) != 0 {
		t.Errorf("Migrate of the older release = %v, %v, want nothing applied", applied, err)
	}
	var n int
	if err := owner.Get(&n, `SELECT f()`); err != nil || n != 2 {
		t.Errorf("f() = %d, %v after the older binary's Migrate, want the later release's 2", n, err)
	}
	owner.MustExec(`DELETE FROM schema_migration WHERE version = 2`)
	if applied, err := Migrate(ctx, owner, older); err != nil || strings.Join(applied, " ") != "functions/f.sql" {
		t.Errorf("Migrate of the same release with f changed = %v, %v, want f applied", applied, err)
	}
}

// A function the numbered migrations may call is made before them, so it
// may call only functions made before them too.
func TestAFunctionMadeBeforeTheMigrationsCallsOnlySuch(t *testing.T) {
	fsys := fstest.MapFS{
		"functions/a.sql": {Data: []byte(earlyMark + "\nCREATE OR REPLACE FUNCTION a() RETURNS int LANGUAGE sql AS $$ SELECT b() $$;")},
		"functions/b.sql": {Data: []byte("CREATE OR REPLACE FUNCTION b() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;")},
	}
	if _, err := functions(fsys); err == nil || !strings.Contains(err.Error(), "functions/a.sql calls functions/b.sql") {
		t.Errorf("functions() = %v, want it to name the early function calling a later one", err)
	}
	fsys["functions/b.sql"] = &fstest.MapFile{Data: []byte(earlyMark + "\n" + string(fsys["functions/b.sql"].Data))}
	if _, err := functions(fsys); err != nil {
		t.Errorf("functions() = %v with both made early", err)
	}
	fns, err := functions(os.DirFS("../sql"))
	if err != nil {
		t.Fatal(err)
	}
	var early []string
	for _, f := range fns {
		if f.early {
			early = append(early, f.name)
		}
	}
	if want := []string{"inbox_bound", "inbox_day_bound", "written_here", "journal_mark_vouched_before", "reconcile_checkpoint_stamp"}; !slices.Equal(early, want) {
		t.Errorf("made before the migrations: %v, want %v (sql/0012 calls the first two; sql/0018 and sql/0019 make triggers of "+
			"the last two, and the last calls written_here)", early, want)
	}
}
