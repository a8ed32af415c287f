package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"text/tabwriter"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/consumer"
	"transferconsumer/db"
	"transferconsumer/dlq"
)

func migrateCommand(ctx context.Context, cfg config, migrations fs.FS, stdout io.Writer) error {
	database, err := db.Open(ctx, cfg.DatabaseURL, 2)
	if err != nil {
		return err
	}
	defer database.Close()
	applied, err := db.Migrate(ctx, database, migrations)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "applied %d migration(s) %v\n", len(applied), applied)
	return nil
}

func pruneCommand(ctx context.Context, cfg config, stdout io.Writer) error {
	database, err := db.Open(ctx, cfg.DatabaseURL, 2)
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

func topologyCommand(cfg config, stdout io.Writer) error {
	conn, err := dial(cfg, "topology")
	if err != nil {
		return err
	}
	defer conn.Close()
	t := cfg.topology()
	if err := t.Declare(conn); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "declared exchange %s, queues %s … %s, and %s → %s\n",
		t.Prefix, t.Queue(0), t.Queue(t.Queues-1), dlq.Exchange(t.Prefix), dlq.Queue(t.Prefix))
	return nil
}

const repartitionUsage = `Usage: transferconsumer repartition --to N [--drain-timeout D]

Raises the queue count from QUEUE_COUNT to N without reordering any
account's events (adr/0004): declares and binds the new queues, then waits
until every old queue has been seen empty. Then run the replicas with
QUEUE_COUNT=N. Lowering the count is a manual procedure, in adr/0004.
`

func repartitionCommand(ctx context.Context, cfg config, args []string, stdout io.Writer) error {
	fset := flag.NewFlagSet("repartition", flag.ContinueOnError)
	fset.SetOutput(stdout)
	fset.Usage = func() { fmt.Fprint(stdout, repartitionUsage) }
	to := fset.Int("to", 0, "the new queue count")
	timeout := fset.Duration("drain-timeout", 10*time.Minute, "how long to wait for the old queues")
	if err := fset.Parse(args); err != nil {
		return flagErr(err)
	}
	if *to <= cfg.QueueCount || *to > 1024 {
		return fmt.Errorf("repartition: --to must be above QUEUE_COUNT=%d and at most 1024, got %d", cfg.QueueCount, *to)
	}
	conn, err := dial(cfg, "repartition")
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	return cfg.topology().Grow(ctx, conn, *to, func(msg string) { fmt.Fprintln(stdout, msg) })
}

func dial(cfg config, purpose string) (*amqp.Connection, error) {
	conn, _, err := consumer.Dial(cfg.amqpURLs(), 0, cfg.instance()+"-"+purpose)
	if err != nil {
		return nil, fmt.Errorf("connect to broker at %s: %s", redact(cfg.AMQPURL), redactErr(err))
	}
	return conn, nil
}

const dlqUsage = `Usage:
  transferconsumer dlq list [-n N]
  transferconsumer dlq replay [--class C] [--reason TEXT] [--event-id ID] [--limit N] [--dry-run]
                              [--include-older-than-ttl]

list shows how many dead letters there are by class and reason, and the first
N. replay publishes the matching ones back to the exchange with their original
routing key, each removed from the DLQ only after the broker confirmed it.
Replaying an event that was already applied changes nothing, within the inbox
retention (INBOX_TTL): letters that failed longer ago are left alone unless
--include-older-than-ttl is given.

Each run reads at most as many letters as the DLQ held when it started;
letters that arrive meanwhile wait for the next run. replay marks the letters
it puts back with the run's id (header x-replay-run) and never replays one
that carries it: a letter that fails again at once is back in the DLQ when the
run ends, replayed once. Run replay again to retry it.
`

func dlqCommand(cfg config, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("dlq needs list or replay\n" + dlqUsage)
	}
	fset := flag.NewFlagSet("dlq "+args[0], flag.ContinueOnError)
	fset.SetOutput(stdout)
	fset.Usage = func() { fmt.Fprint(stdout, dlqUsage) }
	switch args[0] {
	case "list":
		first := fset.Int("n", 20, "how many dead letters to show")
		if err := fset.Parse(args[1:]); err != nil {
			return flagErr(err)
		}
		conn, err := dial(cfg, "dlq-list")
		if err != nil {
			return err
		}
		defer conn.Close()
		s, err := dlq.List(conn, cfg.Prefix, *first)
		if err != nil {
			return err
		}
		printSummary(stdout, dlq.Queue(cfg.Prefix), s)
		return nil
	case "replay":
		var f dlq.Filter
		fset.StringVar(&f.Class, "class", "", "only this failure class (poison, producer-conflict, delivery_limit, …)")
		fset.StringVar(&f.Reason, "reason", "", "only letters whose reason contains this text")
		fset.StringVar(&f.EventID, "event-id", "", "only this event")
		limit := fset.Int("limit", 0, "replay at most this many (0: all that match)")
		dryRun := fset.Bool("dry-run", false, "show what would be replayed; change nothing")
		old := fset.Bool("include-older-than-ttl", false,
			"also replay letters that failed longer than INBOX_TTL ago (the inbox may no longer know them)")
		if err := fset.Parse(args[1:]); err != nil {
			return flagErr(err)
		}
		if !*old {
			f.FailedAfter = time.Now().Add(-cfg.InboxTTL)
		}
		if *limit < 0 {
			return errors.New("dlq replay: --limit must not be negative")
		}
		conn, err := dial(cfg, "dlq-replay")
		if err != nil {
			return err
		}
		defer conn.Close()
		r, err := dlq.Replay(conn, cfg.Prefix, f, *limit, *dryRun)
		verb := "replayed"
		if *dryRun {
			verb = "would replay"
		}
		fmt.Fprintf(stdout, "scanned %d of the %d dead letter(s) the DLQ held at the start, %s %d\n",
			r.Scanned, r.Depth, verb, len(r.Replayed))
		if !*dryRun && len(r.Replayed) > 0 {
			fmt.Fprintf(stdout, "replay run %s: in header %s of each letter it put back, also of one that failed again\n",
				r.Run, dlq.HeaderReplayRun)
		}
		printLetters(stdout, r.Replayed)
		return err
	}
	return fmt.Errorf("unknown dlq command %q\n%s", args[0], dlqUsage)
}

func flagErr(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

func printSummary(w io.Writer, queue string, s dlq.Summary) {
	fmt.Fprintf(w, "%s: %d dead letter(s)\n", queue, s.Total)
	if s.Total == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nCOUNT\tCLASS\tREASON")
	for _, g := range s.Groups {
		fmt.Fprintf(tw, "%d\t%s\t%s\n", g.Count, g.Class, oneLine(g.Reason, 100))
	}
	tw.Flush()
	fmt.Fprintf(w, "\nFirst %d:\n", len(s.Letters))
	printLetters(w, s.Letters)
}

func printLetters(w io.Writer, letters []dlq.Letter) {
	if len(letters) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "EVENT ID\tCLASS\tQUEUE\tROUTING KEY\tFAILED AT\tREASON")
	for _, l := range letters {
		at := ""
		if !l.FailedAt.IsZero() {
			at = l.FailedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", orDash(l.EventID), l.Class, orDash(l.Queue),
			orDash(l.RoutingKey), orDash(at), oneLine(l.Reason, 80))
	}
	tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > max {
		return string(r[:max]) + "…"
	}
	return s
}
