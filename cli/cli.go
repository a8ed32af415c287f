// Package cli is the command line: its usage, the parsing of each
// command's flags (before the configuration is read, so that help and a
// wrong flag need neither the broker nor the database), and the commands
// that do one thing and exit: migrate, topology, repartition, prune, dlq,
// reconcile and recover. The default command, run, is the service, which the
// caller wires (App.Serve); PruneLoop and ReconcileLoop are the prune and
// reconcile commands as the service runs them periodically.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"

	"transferconsumer/config"
)

const usageText = `Usage: transferconsumer [command]

Commands:
  (none), run          consume every partition queue until SIGTERM or SIGINT
  migrate [--grant-to ROLE]
                       create or update the database schema, then exit (see migrate --help)
  topology             declare the exchanges, queues and bindings, then exit
  prune                delete inbox rows older than INBOX_TTL, then exit
  repartition --to N   add queues up to N without reordering accounts (see repartition --help)
  dlq list [flags]     count the dead letters by class and reason, show the first ones
  dlq replay [flags]   put dead letters back on the exchange (see dlq replay --help)
  dlq drop [flags]     remove dead letters for good, each written to a record first (see dlq drop --help)
  recover [--accept-loss]
                       apply again from the journal (JOURNAL_STREAM) what the database lost
                       after its ack: a failover to a standby behind, a restore (see recover --help)
  reconcile [flags]    prove every balance from the transfers, report suspected duplicate
                       intents and stuck transitions; exit 3 when it finds any (see reconcile --help)
  help                 print this text

`

func flagErr(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// App is the command line with what it runs with.
type App struct {
	Migrations     fs.FS // the schema's migrations, sql/*.sql
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Serve runs the service (the run command) with cfg until ctx ends.
	Serve func(ctx context.Context, cfg config.Config) error
}

// Run runs the command args name ("run" when there is none). An error
// says what went wrong; Found tells reconcile's findings apart.
func (a App) Run(ctx context.Context, args []string) error {
	cmd := "run"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(a.Stdout, usageText)
		return config.PrintUsage(a.Stdout)
	case "run", "migrate", "topology", "prune", "repartition", "dlq", "reconcile", "recover":
	default:
		return fmt.Errorf("unknown command %q (try --help)", cmd)
	}
	if cmd != "dlq" && cmd != "repartition" && cmd != "migrate" && cmd != "reconcile" && cmd != "recover" && len(args) > 0 {
		return fmt.Errorf("%s takes no arguments, got %q", cmd, args)
	}
	var dlqCmd dlqArgs
	var grantTo string
	var reconcileCmd reconcileArgs
	var acceptLoss bool
	// Before the configuration: help and a wrong flag need neither it nor
	// the broker or the database.
	switch cmd {
	case "dlq":
		var err error
		if dlqCmd, err = parseDLQ(args, a.Stdout); err != nil {
			return flagErr(err)
		}
	case "migrate":
		var err error
		if grantTo, err = parseMigrate(args, a.Stdout); err != nil {
			return flagErr(err)
		}
	case "reconcile":
		var err error
		if reconcileCmd, err = parseReconcile(args, a.Stdout); err != nil {
			return flagErr(err)
		}
	case "recover":
		var err error
		if acceptLoss, err = parseRecover(args, a.Stdout); err != nil {
			return flagErr(err)
		}
	}

	cfg, err := config.Load()
	if err != nil {
		return err
	}
	switch cmd {
	case "migrate":
		return migrateCommand(ctx, cfg, a.Migrations, grantTo, a.Stdout)
	case "topology":
		return topologyCommand(cfg, a.Stdout)
	case "prune":
		return pruneCommand(ctx, cfg, a.Stdout)
	case "dlq":
		return dlqCommand(ctx, cfg, dlqCmd, a.Stdin, a.Stdout, a.Stderr)
	case "repartition":
		return repartitionCommand(ctx, cfg, args, a.Stdout)
	case "reconcile":
		return reconcileCommand(ctx, cfg, a.Migrations, reconcileCmd, a.Stdout)
	case "recover":
		return recoverCommand(ctx, cfg, acceptLoss, a.Stdout, a.Stderr)
	}
	if a.Serve == nil {
		return errors.New("run: no service to run")
	}
	return a.Serve(ctx, cfg)
}
