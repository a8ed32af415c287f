package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"transferconsumer/config"
	"transferconsumer/db"
	"transferconsumer/event"
	"transferconsumer/journal"
)

const recoverUsage = `Usage: transferconsumer recover [--accept-loss]

For each partition queue, compares the database's journal mark with the
journal (JOURNAL_STREAM) and applies again, in order, the entries the
database lacks: what a failover to a standby that was behind, or a
point-in-time restore, took back after the service had acked it. The
service does the same by itself before it consumes a queue, and whenever
the database does not hold the mark it went on from (adr/0014); run this
after a restore to know at once. Running beside the service is harmless.

When the journal no longer reaches back to a queue's mark (its retention
took entries no one holds now), it says how many events at most are lost
and since when, and exits 1: the service does not consume that queue
until --accept-loss moves the queue's mark past them. The same holds for
a journal message that no longer parses: it names the entries above the
mark it holds, its offset in the stream and why, and --accept-loss moves
the mark past exactly those, saying so again. An entry whose event no
longer decodes in a message that parses is no loss to accept: it goes to
the dead-letter queue with its reason, and its neighbours are applied.

Flags:
  --accept-loss   accept the loss a queue's report names, and restore the rest
`

func parseRecover(args []string, help io.Writer) (accept bool, err error) {
	fset := flag.NewFlagSet("recover", flag.ContinueOnError)
	fset.SetOutput(io.Discard) // its errors come back with the usage
	fset.Usage = func() {}
	acceptLoss := fset.Bool("accept-loss", false, "accept the loss a queue's report names")
	err = fset.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(help, recoverUsage)
		return false, err
	case err != nil:
		return false, fmt.Errorf("recover: %v\n\n%s", err, recoverUsage)
	case fset.NArg() > 0:
		return false, fmt.Errorf("recover takes no arguments, got %q\n\n%s", fset.Args(), recoverUsage)
	}
	return *acceptLoss, nil
}

func recoverCommand(ctx context.Context, cfg config.Config, accept bool, stdout, stderr io.Writer) error {
	if cfg.JournalStream == "" {
		return errors.New("recover: JOURNAL_STREAM is not set: there is no journal to recover from")
	}
	database, err := db.OpenFrom(ctx, cfg.Database, 2)
	if err != nil {
		return err
	}
	defer database.Close()
	in := db.NewInbox(database)
	jr := journal.New(cfg.Journal())
	defer jr.Close()
	jr.Use(in)
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	// Every queue in one read of the stream; those whose loss is accepted
	// are read again alone.
	lanes := make([]*journal.Lane, cfg.QueueCount)
	for i := range lanes {
		lanes[i] = jr.Wrap(cfg.Topology().Queue(i), in.Lane(cfg.ApplyTimeout).(event.MarkedLane), log)
		defer lanes[i].Close()
	}
	applied, errs := jr.RecoverAll(ctx, lanes)
	short := 0
	for i, l := range lanes {
		queue := cfg.Topology().Queue(i)
		n, err := applied[queue], errs[queue]
		var se *journal.ShortError
		if errors.As(err, &se) && accept {
			if err = l.AcceptLoss(ctx, se); err == nil {
				fmt.Fprintln(stdout, accepted(queue, se))
				n, err = l.Recover(ctx)
			}
		}
		switch {
		case errors.As(err, &se):
			fmt.Fprintf(stdout, "%s: %v\n", queue, err)
			short++
		case err != nil:
			return fmt.Errorf("recover %s: %w", queue, err)
		default:
			fmt.Fprintf(stdout, "%s: %d entries applied again; the database holds the journal up to entry %d\n", queue, n, l.Mark())
		}
	}
	if short > 0 {
		return fmt.Errorf("recover: %d queue(s) cannot be restored whole; the service does not consume them until recover --accept-loss", short)
	}
	return nil
}

// accepted is what recover --accept-loss says it moved queue's mark past:
// exactly the entries se names (its Mark+1 … First-1), and why they are
// lost.
func accepted(queue string, se *journal.ShortError) string {
	if se.Unreadable != nil {
		return fmt.Sprintf("%s: accepted the loss of entries %d to %d (%d events): the journal's message at offset %v, "+
			"which holds entries %d to %d, does not parse: %v",
			queue, se.Mark+1, se.First-1, se.Missing(), se.Offset, se.Holds[0], se.Holds[1], se.Unreadable)
	}
	return fmt.Sprintf("%s: accepted the loss of up to %d events (entries %d to %d) acked after %s, which the journal no longer holds",
		queue, se.Missing(), se.Mark+1, se.First-1, se.Since.UTC().Format("2006-01-02T15:04:05Z"))
}
