package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/config"
	"transferconsumer/consumer"
	"transferconsumer/dlq"
)

func topologyCommand(cfg config.Config, stdout io.Writer) error {
	conn, err := dial(cfg, "topology")
	if err != nil {
		return err
	}
	defer conn.Close()
	t := cfg.Topology()
	existing, err := t.Existing(conn)
	if err != nil {
		return err
	}
	if existing > 0 && existing < t.Queues {
		// Declaring more queues binds them to the hash exchange at once:
		// keys move to queues nobody consumes yet, while their older
		// events still wait in the old ones.
		return fmt.Errorf("topology: %d partition queues exist (%s … %s) and QUEUE_COUNT=%d would add %d more, "+
			"moving accounts to new queues while their older events wait in the old ones; "+
			"to raise the count, or to declare again a last queue that was deleted, run "+
			"transferconsumer repartition --to %d with QUEUE_COUNT=%d, which waits for the old queues to drain (adr/0004); "+
			"otherwise set QUEUE_COUNT=%d",
			existing, t.Queue(0), t.Queue(existing-1), t.Queues, t.Queues-existing, t.Queues, existing, existing)
	}
	if err := t.Declare(conn); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "declared exchange %s, queues %s … %s, and %s → %s\n",
		t.Prefix, t.Queue(0), t.Queue(t.Queues-1), dlq.Exchange(t.Prefix), dlq.Queue(t.Prefix))
	if cfg.JournalStream != "" {
		j := cfg.Journal()
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		defer ch.Close()
		if _, err := ch.QueueDeclare(j.Stream, true, false, false, false, j.Args()); err != nil {
			return fmt.Errorf("topology: the journal %s: %w", j.Stream, err)
		}
		fmt.Fprintf(stdout, "declared the journal, stream %s (x-max-age %s)\n", j.Stream, j.MaxAge)
	}
	return nil
}

const repartitionUsage = `Usage: transferconsumer repartition --to N [--drain-timeout D]

Raises the queue count from QUEUE_COUNT to N without reordering any
account's events (adr/0004): declares and binds the new queues, then waits
until every old queue has been seen empty. Then run the replicas with
QUEUE_COUNT=N. Lowering the count is a manual procedure, in adr/0004.

  --to N              the new queue count, above QUEUE_COUNT, at most 1024
  --drain-timeout D   how long to wait for every old queue to be seen empty
                      (default 10m); when it passes, the command fails, the
                      new queues stay declared and bound, and running it
                      again with the same --to resumes the wait
`

func repartitionCommand(ctx context.Context, cfg config.Config, args []string, stdout io.Writer) error {
	fset := flag.NewFlagSet("repartition", flag.ContinueOnError)
	fset.SetOutput(io.Discard) // its errors come back with the usage
	fset.Usage = func() {}
	to := fset.Int("to", 0, "the new queue count")
	timeout := fset.Duration("drain-timeout", 10*time.Minute, "how long to wait for the old queues")
	switch err := fset.Parse(args); {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, repartitionUsage)
		return nil
	case err != nil:
		return fmt.Errorf("repartition: %v\n\n%s", err, repartitionUsage)
	case fset.NArg() > 0:
		return fmt.Errorf("repartition takes no arguments, got %q\n\n%s", fset.Args(), repartitionUsage)
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
	return cfg.Topology().Grow(ctx, conn, *to, func(msg string) { fmt.Fprintln(stdout, msg) })
}

func dial(cfg config.Config, purpose string) (*amqp.Connection, error) {
	urls, err := cfg.BrokerURLs()
	if err != nil {
		return nil, err
	}
	conn, _, err := consumer.Dial(urls, 0, cfg.Instance()+"-"+purpose)
	if err != nil {
		return nil, fmt.Errorf("connect to broker at %s: %s", config.Redact(strings.Join(urls, ",")), config.RedactErr(err))
	}
	return conn, nil
}
