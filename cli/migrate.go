package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"time"

	"transferconsumer/config"
	"transferconsumer/db"
)

const migrateUsage = `Usage: transferconsumer migrate [--grant-to ROLE]

Applies the migrations the schema lacks, and the function files (sql/functions)
whose text changed, in one transaction; then maintains the inbox's partitions
(adr/0011): makes the next 31 days' partitions and drops those past INBOX_TTL.
Run it daily (a CronJob), then it exits.
Run it as the role that owns the schema: the service itself then needs no
privilege beyond data, and checks at start that the schema is current.

--grant-to ROLE then grants ROLE, the service's role, what the service
needs and nothing that changes the schema: CONNECT on the database, USAGE
on the schema, SELECT, INSERT, UPDATE and DELETE on every table of the
schema (only SELECT on schema_migration), USAGE on its sequences and
EXECUTE on its functions; and, by ALTER DEFAULT PRIVILEGES for the role
running this command, the same on the tables, sequences and functions
later migrations create. Run later migrations as the same role. Running it
again changes nothing.
`

// parseMigrate parses migrate's arguments; it needs neither the
// configuration nor the database. It returns the role to grant to, or "".
func parseMigrate(args []string, help io.Writer) (string, error) {
	fset := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fset.SetOutput(io.Discard) // its errors come back with the usage
	fset.Usage = func() {}
	grantTo := fset.String("grant-to", "", "the service's role, to grant what it needs")
	err := fset.Parse(args)
	given := false
	fset.Visit(func(f *flag.Flag) { given = given || f.Name == "grant-to" })
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(help, migrateUsage)
		return "", err
	case err != nil:
		return "", fmt.Errorf("migrate: %v\n\n%s", err, migrateUsage)
	case fset.NArg() > 0:
		return "", fmt.Errorf("migrate takes no arguments, got %q\n\n%s", fset.Args(), migrateUsage)
	case given && strings.TrimSpace(*grantTo) == "":
		return "", fmt.Errorf("migrate: --grant-to needs a role\n\n%s", migrateUsage)
	}
	return *grantTo, nil
}

func migrateCommand(ctx context.Context, cfg config.Config, migrations fs.FS, grantTo string, stdout io.Writer) error {
	database, err := db.OpenFrom(ctx, cfg.Database, 2)
	if err != nil {
		return err
	}
	defer database.Close()
	applied, err := db.Migrate(ctx, database, migrations)
	if db.Refused(err) {
		return fmt.Errorf("%w: run migrate as the role that owns the schema", err)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "applied %d migration(s) %v\n", len(applied), applied)
	done, err := db.Maintain(ctx, database, cfg.InboxTTL)
	if err != nil {
		return err
	}
	for _, d := range done {
		fmt.Fprintf(stdout, "inbox: %s\n", d)
	}
	if grantTo == "" {
		return nil
	}
	if err := db.Grant(ctx, database, grantTo); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "granted %s what the service needs on the schema, and on what later migrations create\n", grantTo)
	return nil
}

func pruneCommand(ctx context.Context, cfg config.Config, stdout io.Writer) error {
	database, err := db.OpenFrom(ctx, cfg.Database, 2)
	if err != nil {
		return err
	}
	defer database.Close()
	start := time.Now()
	res, err := db.Prune(ctx, database, cfg.InboxTTL, cfg.PruneBatch)
	if err != nil {
		return fmt.Errorf("after deleting %d rows: %w", res.Deleted, err)
	}
	if !res.Ran {
		fmt.Fprintln(stdout, "another replica is pruning; nothing done")
		return nil
	}
	fmt.Fprintf(stdout, "deleted %d inbox rows older than %s in %d batch(es), %s\n",
		res.Deleted, cfg.InboxTTL, res.Batches, time.Since(start).Round(time.Millisecond))
	return nil
}
