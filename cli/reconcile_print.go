package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"transferconsumer/reconcile"
)

// passName names the pass r was: full or periodic.
func passName(r reconcile.Reconciliation) string {
	if r.Full {
		return "full"
	}
	return "periodic"
}

// checkpointLine says what the pass made of the checkpoint.
func checkpointLine(r reconcile.Reconciliation) string {
	c := r.Checkpoint
	why := c.Broken
	if why == "" {
		why = c.Distrusted
	}
	switch {
	case !r.Full:
		return fmt.Sprintf("from its cut-off of %s, moved to this snapshot", stamp(c.WrittenAt))
	case c.Rebuilt && !c.Present:
		return "made (there was none)"
	case c.Rebuilt && why != "":
		return "made anew: the one found was not to be trusted (" + why + ")"
	case c.Rebuilt:
		return "made anew (a full pass was due)"
	case !c.Present:
		return "none yet (the service's first periodic pass makes it)"
	case !c.Compared:
		return "not compared: " + why
	case c.Differs == 0:
		return fmt.Sprintf("ok: the transfers sum to it (cut-off %s)", stamp(c.WrittenAt))
	}
	return fmt.Sprintf("%d account(s) whose transfers changed since its cut-off (%s)", c.Differs, stamp(c.WrittenAt))
}

func stamp(t *time.Time) string {
	if t == nil {
		return "unknown"
	}
	return t.UTC().Format(time.RFC3339)
}

// printReconcile writes rep for a person: one line per kind of finding,
// then the findings shown, kind by kind.
func printReconcile(w io.Writer, rep reconcileReport) {
	if rep.Full {
		fmt.Fprintf(w, "reconcile: full pass, snapshot of %s: %d transfers, %d balance rows, read in %s\n",
			rep.At.UTC().Format(time.RFC3339), rep.Transfers, rep.Accounts, rep.Duration.Round(time.Millisecond))
	} else {
		fmt.Fprintf(w, "reconcile: periodic pass, snapshot of %s: %d transfers created or failed since the checkpoint, %d accounts compared, read in %s\n",
			rep.At.UTC().Format(time.RFC3339), rep.Transfers, rep.Accounts, rep.Duration.Round(time.Millisecond))
	}
	if rep.Recorded {
		fmt.Fprintln(w, "  (written down: the findings below are every one not yet resolved, whichever pass found it)")
	}
	count := func(n int, none, some string) string {
		if n == 0 {
			return none
		}
		return fmt.Sprintf("%d %s", n, some)
	}
	letters := rep.DeadLetters.Error
	if rep.DeadLetters.Read {
		letters = count(rep.DeadLetters.Old+rep.DeadLetters.Undated, fmt.Sprintf("none of %d", rep.DeadLetters.Total),
			fmt.Sprintf("of %d (%d older, %d undated)", rep.DeadLetters.Total, rep.DeadLetters.Old, rep.DeadLetters.Undated))
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  balances\t%s\n", count(rep.DriftCount, "ok: each is the net of its transfers", "account(s) in drift"))
	fmt.Fprintf(tw, "  checkpoint\t%s\n", checkpointLine(rep.Reconciliation))
	fmt.Fprintf(tw, "  duplicate intents (within %s)\t%s\n", rep.Window, count(rep.DupCount, "none", "suspected"))
	fmt.Fprintf(tw, "  transitions waiting (over %s)\t%s\n", rep.After, count(rep.WaitCount, "none", "waiting for their creation"))
	fmt.Fprintf(tw, "  dead letters older than INBOX_TTL (%s)\t%s\n", rep.InboxTTL, letters)
	tw.Flush()
	if rep.DeadLetters.Read {
		rep.DeadLetters.BrokerCount.printUnseen(w)
	}

	section := func(title string, shown, total int, header string, row func(i int) string) {
		if total == 0 {
			return
		}
		fmt.Fprintf(w, "\n%s: %d", title, total)
		if shown < total {
			fmt.Fprintf(w, " (the first %d)", shown)
		}
		fmt.Fprintln(w)
		if shown == 0 {
			return
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, header)
		for i := range shown {
			fmt.Fprintln(tw, row(i))
		}
		tw.Flush()
	}
	ts := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	// A recorded pass says since when each finding has been reported.
	seen, since := "", func(*time.Time) string { return "" }
	if rep.Recorded {
		seen = "\tFIRST SEEN"
		since = func(t *time.Time) string { return "\t" + stamp(t) }
	}
	section("Balances in drift", len(rep.Drift), rep.DriftCount, "ACCOUNT\tEXPECTED\tACTUAL\tDIFFERENCE"+seen, func(i int) string {
		d := rep.Drift[i]
		actual := "no balance row"
		if d.Actual != nil {
			actual = fmt.Sprint(*d.Actual)
		}
		return fmt.Sprintf("%s\t%d\t%s\t%+d%s", d.Account, d.Expected, actual, d.Difference, since(d.FirstSeen))
	})
	section("Transfers changed since the checkpoint's cut-off (a transfer it counted was changed or removed by hand)",
		len(rep.Changed), rep.ChangedCount, "ACCOUNT\tTRANSFERS\tCHECKPOINT\tDIFFERENCE\tCHECKPOINT MADE AT\tFIRST SEEN", func(i int) string {
			c := rep.Changed[i]
			cp := "no row"
			if c.Checkpoint != nil {
				cp = fmt.Sprint(*c.Checkpoint)
			}
			seen := "this pass (not written down: it reads only)"
			if c.FirstSeen != nil {
				seen = stamp(c.FirstSeen)
			}
			return fmt.Sprintf("%s\t%d\t%s\t%+d\t%s\t%s", c.Account, c.Transfers, cp, c.Difference, stamp(c.CheckpointMadeAt), seen)
		})
	if rep.ChangedCount > 0 {
		fmt.Fprintln(w, "(each is reported until a person resolves it, with why: INSERT INTO reconcile_resolved (kind, subject, note) "+
			"SELECT kind, subject, 'why' FROM reconcile_finding WHERE kind = 'changed' AND detail->>'account' = 'ACCOUNT' ON CONFLICT DO NOTHING)")
	}
	section("Suspected duplicate intents", len(rep.Duplicates), rep.DupCount,
		"TRANSFER\tCREATED AT\tREPEATS\tCREATED AT\tAPART\tFROM → TO\tAMOUNT"+seen, func(i int) string {
			d := rep.Duplicates[i]
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s → %s\t%d %s%s", d.Transfer, ts(d.CreatedAt), d.Earlier, ts(d.EarlierAt),
				d.CreatedAt.Sub(d.EarlierAt).Round(time.Millisecond), d.From, d.To, d.Amount, d.Currency, since(d.FirstSeen))
		})
	if rep.DupCount > 0 {
		fmt.Fprintln(w, "(a pair found meant is dismissed with INSERT INTO reconcile_dismissed (transfer_id, note) VALUES ('TRANSFER', 'why'))")
	}
	section("Transitions waiting for their creation", len(rep.Waiting), rep.WaitCount,
		"TRANSFER\tEVENT ID\tTYPE\tRECEIVED AT\tFROM → TO\tAMOUNT"+seen, func(i int) string {
			x := rep.Waiting[i]
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s → %s\t%d %s%s", x.Transfer, x.EventID, x.EventType, ts(x.ReceivedAt),
				x.From, x.To, x.Amount, x.Currency, since(x.FirstSeen))
		})
	section("Dead letters the inbox can no longer prove harmless to replay", len(rep.DeadLetters.Letters),
		rep.DeadLetters.Old+rep.DeadLetters.Undated, "EVENT ID\tCLASS\tDEAD SINCE\tREASON", func(i int) string {
			l := rep.DeadLetters.Letters[i]
			since := "no time shown"
			if l.DeadSince != nil {
				since = ts(*l.DeadSince)
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s", orDash(l.EventID), l.Class, since, oneLine(l.Reason, 80))
		})
	if n := rep.findings(); n > 0 {
		kinds := []string{}
		for _, k := range []struct {
			n    int
			name string
		}{{rep.DriftCount, "drift"}, {rep.ChangedCount, "transfers changed"}, {rep.DupCount, "duplicate intents"}, {rep.WaitCount, "waiting transitions"},
			{rep.DeadLetters.Old + rep.DeadLetters.Undated, "old dead letters"}} {
			if k.n > 0 {
				kinds = append(kinds, k.name)
			}
		}
		fmt.Fprintf(w, "\nfound: %s (exit status %d)\n", strings.Join(kinds, ", "), ExitFound)
	}
}

// printReconcileJSON writes rep for machines.
func printReconcileJSON(w io.Writer, rep reconcileReport) error {
	section := func(count int, items any, setting string, d time.Duration) map[string]any {
		s := map[string]any{"count": count, "items": items}
		if setting != "" {
			s[setting] = d.String()
		}
		return s
	}
	letters := rep.DeadLetters
	letters.Letters = orEmpty(letters.Letters)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(map[string]any{
		"clean":               rep.findings() == 0,
		"pass":                passName(rep.Reconciliation),
		"recorded":            rep.Recorded,
		"checkpoint":          rep.Checkpoint,
		"changed":             section(rep.ChangedCount, orEmpty(rep.Changed), "", 0),
		"oldest_finding_at":   rep.OldestFinding,
		"snapshot_at":         rep.At,
		"duration_ms":         rep.Duration.Milliseconds(),
		"transfers":           rep.Transfers,
		"accounts":            rep.Accounts,
		"drift":               section(rep.DriftCount, orEmpty(rep.Drift), "", 0),
		"duplicate_intents":   section(rep.DupCount, orEmpty(rep.Duplicates), "window", rep.Window),
		"waiting_transitions": section(rep.WaitCount, orEmpty(rep.Waiting), "older_than", rep.After),
		"dead_letters":        letters,
		"inbox_ttl":           rep.InboxTTL.String(),
	})
}

// orEmpty makes a nil list [] in JSON.
func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
