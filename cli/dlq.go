package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"transferconsumer/config"
	"transferconsumer/dlq"
)

const dlqUsage = `Usage:
  transferconsumer dlq list [-n N] [--wait D] [--group G]
  transferconsumer dlq replay [--class C] [--reason TEXT] [--event-id ID] [--group G] [--limit N] [--dry-run]
                              [--rate N/s] [--include-older-than-ttl] [--audit FILE]
  transferconsumer dlq drop --record FILE [--class C] [--reason TEXT] [--event-id ID] [--group G] [--limit N]
                            [--yes] [--dry-run] [--audit FILE]
  transferconsumer dlq help

list shows the dead letters by group, and the first N. A group is one failure:
its fingerprint (header x-failure-group) is taken from the class and the reason
with the variable parts (ids, amounts, times, quoted values) left out, so the
letters of one failure that name their own ids are one group. For each group
list shows its fingerprint, count, class, first and last failure, the queues
its letters failed on, how many were replayed before, and a sample reason.
--group G, on list, replay and drop, takes only the letters of group G. replay publishes the matching ones back to the exchange with their original
routing key, each removed from the DLQ only after the broker confirmed it.
Replaying an event that was already applied changes nothing, within the inbox
retention (INBOX_TTL): letters that failed longer ago, and letters that show
no failure time at all, are left alone unless --include-older-than-ttl is
given. So are poison and producer-conflict letters, which cannot apply again
(the same body fails the same way; the event id was applied with other
content), and unauthorized ones (a producer PRODUCERS does not list), unless
--class names their class. A replayed letter keeps its first producer in
x-original-user-id, and is judged by it again.

replay publishes at most --rate letters a second (default 100/s: a large group
goes back beside live traffic without taking the queues from it; 0 for as fast
as the broker confirms) and, on a terminal, shows how many it replayed, how
many letters are left to read and its rate. SIGINT (Ctrl-C) or SIGTERM stops
it between two letters: each letter is then either confirmed republished and
removed, or still in the DLQ; run it again to go on.

Each replay and drop that changes the DLQ appends one line of JSON to the
audit log (--audit FILE, else DLQ_AUDIT_LOG), synced: who ran it, when, its
filter and rate, how many it replayed, confirmed, dropped, skipped and left,
and the event ids that went. A log that cannot be opened refuses the run.

drop removes the matching letters for good. It writes each one (body, headers
and properties) as a line of JSON to the --record file, appended and synced,
or to stdout with --record -, and removes a letter only once its record is
written. --record is required, but with --dry-run, which records and removes
nothing. drop shows the letters it would drop and asks to confirm on the
terminal (yes or y), then drops at most as many as it showed; --yes drops
without asking. Without a terminal it refuses unless --yes is given.

Each run of list, replay or drop reads at most as many letters as the DLQ held
when it started; letters that arrive meanwhile wait for the next run, and
letters it leaves go back to the DLQ. replay marks the letters it puts back
with the run's id (header x-replay-run) and never replays one that carries it:
a letter that fails again at once is back in the DLQ when the run ends,
replayed once. Run replay again to retry it.

A run cannot get the letters another reader holds unacknowledged meanwhile
(another dlq command, a replay waiting for its confirms, the management
UI's Get messages). With MANAGEMENT_URL set, each run compares what it read
with the broker's own count and says how many it did not see; list reads
again, for up to --wait, until it sees them all (a replay under way lets go
of its letters when it ends); without MANAGEMENT_URL, each says that it
could not check.

Before it reads, each command checks that reading cannot drop letters: where
the DLQ has a delivery limit that counts a return (on 3.x and 4.0-4.2 every
return counts; from 4.3 a basic.nack, which these commands use, does not),
it refuses, and reads only with --spend-deliveries.

Classes (--class): poison, producer-conflict, invalid-transition,
data-rejected, unauthorized and panic (an event whose handling panicked
three times), set by the service; rejected, expired, maxlen and
delivery_limit, the broker's reasons when it dead-lettered the message itself;
unknown, a letter with neither.
`

// dlqArgs is a parsed dlq command line.
type dlqArgs struct {
	cmd        string // list, replay or drop
	first      int    // list: how many letters to show
	filter     dlq.Filter
	limit      int
	dryRun     bool
	includeOld bool          // replay letters older than INBOX_TTL too
	record     string        // drop: the file each letter is written to first, "-" for stdout
	yes        bool          // drop without asking
	spend      bool          // read even where reading spends the letters' deliveries (guardDLQ)
	wait       time.Duration // list: how long to read again while another reader holds letters
	rate       rateFlag      // replay: letters a second, 0 for no limit
	audit      string        // replay, drop: the audit log, else DLQ_AUDIT_LOG
}

// parseDLQ parses the arguments of dlq; it needs neither the configuration
// nor the broker. When they ask for help it prints the usage to help and
// returns flag.ErrHelp; when they are wrong, an error that says why and
// ends with the usage.
func parseDLQ(args []string, help io.Writer) (dlqArgs, error) {
	var a dlqArgs
	if len(args) == 0 {
		return a, usageErr("dlq needs list, replay or drop")
	}
	a.cmd = args[0]
	fset := flag.NewFlagSet("dlq "+a.cmd, flag.ContinueOnError)
	fset.SetOutput(io.Discard) // its errors come back with the usage
	fset.Usage = func() {}
	switch a.cmd {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(help, dlqUsage)
		return a, flag.ErrHelp
	case "list":
		fset.StringVar(&a.filter.Group, "group", "", "only the letters of this group (its fingerprint, as list shows it)")
		fset.IntVar(&a.first, "n", 20, "how many dead letters to show")
		fset.DurationVar(&a.wait, "wait", 30*time.Second,
			"with MANAGEMENT_URL: how long to read again while another reader holds letters, before answering with what it saw")
	case "replay", "drop":
		fset.StringVar(&a.filter.Group, "group", "", "only the letters of this group (its fingerprint, as list shows it)")
		fset.StringVar(&a.filter.Class, "class", "", "only this failure class (see Classes above)")
		fset.StringVar(&a.filter.Reason, "reason", "", "only letters whose reason contains this text")
		fset.StringVar(&a.filter.EventID, "event-id", "", "only this event")
		fset.IntVar(&a.limit, "limit", 0, a.cmd+" at most this many (0: all that match)")
		done := "replayed"
		if a.cmd == "drop" {
			done = "dropped"
		}
		fset.BoolVar(&a.dryRun, "dry-run", false, "show what would be "+done+"; change nothing")
		fset.StringVar(&a.audit, "audit", "", "append a record of the run to this file (default DLQ_AUDIT_LOG)")
		if a.cmd == "drop" {
			fset.StringVar(&a.record, "record", "", "append each letter to this file before removing it (- for stdout); required but with --dry-run")
			fset.BoolVar(&a.yes, "yes", false, "drop without asking to confirm")
			break
		}
		a.rate = dlq.DefaultRate
		fset.Var(&a.rate, "rate", "replay at most this many letters a second, N or N/s (0: as fast as the broker confirms)")
		fset.BoolVar(&a.includeOld, "include-older-than-ttl", false,
			"also replay letters that failed longer than INBOX_TTL ago (the inbox may no longer know them)")
	default:
		return a, usageErr(fmt.Sprintf("unknown dlq command %q", a.cmd))
	}
	fset.BoolVar(&a.spend, "spend-deliveries", false,
		"read even where the DLQ's delivery limit counts each read as a delivery and drops letters past it (refused otherwise)")
	err := fset.Parse(args[1:])
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintf(help, "%s\nFlags of dlq %s:\n", dlqUsage, a.cmd)
		fset.SetOutput(help)
		fset.PrintDefaults()
		return a, err
	case err != nil:
		return a, usageErr(fmt.Sprintf("dlq %s: %v", a.cmd, err))
	case fset.NArg() > 0:
		return a, usageErr(fmt.Sprintf("dlq %s takes no arguments, got %q", a.cmd, fset.Args()))
	case a.first < 0:
		return a, usageErr(fmt.Sprintf("dlq list: -n must not be negative, got %d", a.first))
	case a.wait < 0:
		return a, usageErr(fmt.Sprintf("dlq list: --wait must not be negative, got %s", a.wait))
	case a.limit < 0:
		return a, usageErr(fmt.Sprintf("dlq %s: --limit must not be negative, got %d", a.cmd, a.limit))
	case a.filter.Class != "" && !slices.Contains(dlq.Classes(), a.filter.Class):
		return a, fmt.Errorf("dlq %s: --class %q is not a class; the classes are %s",
			a.cmd, a.filter.Class, strings.Join(dlq.Classes(), ", "))
	case a.filter.Group != "" && !dlq.IsFingerprint(a.filter.Group):
		return a, usageErr(fmt.Sprintf("dlq %s: --group %q is not a group's fingerprint (12 hex digits, as dlq list shows it)",
			a.cmd, a.filter.Group))
	case a.cmd == "drop" && !a.dryRun && a.record == "":
		return a, usageErr("dlq drop: --record FILE is required: each letter is written there before it is removed " +
			"(--record - writes to stdout; --dry-run needs none)")
	}
	return a, nil
}

func usageErr(msg string) error { return fmt.Errorf("%s\n\n%s", msg, dlqUsage) }

func dlqCommand(ctx context.Context, cfg config.Config, a dlqArgs, stdin io.Reader, stdout, stderr io.Writer) error {
	switch a.cmd {
	case "drop":
		return dropCommand(cfg, a, stdin, stdout, stderr)
	case "replay":
		return replayCommand(ctx, cfg, a, stdout, stderr)
	}
	conn, err := dial(cfg, "dlq-"+a.cmd)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := guardDLQ(cfg, conn, a.spend, stderr); err != nil {
		return fmt.Errorf("dlq %s: %w", a.cmd, err)
	}
	s, seen, err := readWholeDLQ(cfg, a.wait, func() (dlq.Summary, int, error) {
		s, err := dlq.ListMatching(conn, cfg.Prefix, a.first, a.filter)
		return s, s.Total, err
	})
	if err != nil {
		return noDLQ(cfg, err)
	}
	printSummary(stdout, dlq.Queue(cfg.Prefix), s, a.filter)
	seen.printUnseen(stdout)
	return nil
}

// noDLQ explains the broker's 404 for the dead-letter queue: the topology
// was never declared in this vhost, or under another prefix.
func noDLQ(cfg config.Config, err error) error {
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
		return err
	}
	return fmt.Errorf("no dead-letter queue %s in this vhost (the broker said: %s): check the vhost in AMQP_URL and TOPOLOGY_PREFIX (%q), "+
		"or declare the topology with transferconsumer topology", dlq.Queue(cfg.Prefix), ae.Reason, cfg.Prefix)
}

func printLetters(w io.Writer, letters []dlq.Letter) {
	if len(letters) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "EVENT ID\tGROUP\tCLASS\tQUEUE\tROUTING KEY\tFAILED AT\tREPLAYS\tREASON")
	for _, l := range letters {
		at := ""
		if !l.FailedAt.IsZero() {
			at = l.FailedAt.UTC().Format(time.RFC3339)
		}
		replays := "-"
		if l.Replays > 0 {
			replays = fmt.Sprintf("%d, last %s", l.Replays, l.LastReplay.UTC().Format(time.RFC3339))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", orDash(l.EventID), l.Group, l.Class, orDash(l.Queue),
			orDash(l.RoutingKey), orDash(at), replays, oneLine(l.Reason, 80))
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
