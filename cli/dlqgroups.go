package cli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"transferconsumer/dlq"
)

// printSummary prints what dlq list found: the count, the groups, then the
// first letters. With a filter (--group), the count says how many of the
// letters read it selected.
func printSummary(w io.Writer, queue string, s dlq.Summary, f dlq.Filter) {
	fmt.Fprintf(w, "%s: %d dead letter(s)", queue, s.Total)
	if f.Group != "" {
		fmt.Fprintf(w, ", %d in group %s", s.Matched, f.Group)
	}
	fmt.Fprintf(w, ", %d group(s)\n", len(s.Groups))
	if s.Matched == 0 {
		return
	}
	fmt.Fprintln(w)
	printGroups(w, s.Groups)
	if len(s.Letters) > 0 {
		fmt.Fprintf(w, "\nFirst %d:\n", len(s.Letters))
		printLetters(w, s.Letters)
	}
}

// printGroups prints one line per group, largest first.
func printGroups(w io.Writer, groups []dlq.Group) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tCOUNT\tCLASS\tFIRST FAILED\tLAST FAILED\tQUEUES\tREPLAYED BEFORE\tSAMPLE REASON")
	for _, g := range groups {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\n", g.Fingerprint, g.Count, g.Class,
			orDash(secondOf(g.First)), orDash(secondOf(g.Last)), orDash(queues(g.Queues)), g.Replayed, oneLine(g.Reason, 100))
	}
	tw.Flush()
}

// secondOf is t in RFC 3339 at second precision, "" when zero.
func secondOf(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// queues lists the queues a group failed on, the first three and how many
// more.
func queues(qs []string) string {
	if len(qs) > 3 {
		return fmt.Sprintf("%s +%d", strings.Join(qs[:3], ","), len(qs)-3)
	}
	return strings.Join(qs, ",")
}
