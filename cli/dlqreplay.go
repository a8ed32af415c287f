package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"transferconsumer/config"
	"transferconsumer/dlq"
)

// replayCommand runs dlq replay: at --rate, with its progress on stderr when
// stderr is a terminal, until ctx ends (SIGINT, SIGTERM), which stops it
// between two letters (dlq.ReplayPaced).
func replayCommand(ctx context.Context, cfg config.Config, a dlqArgs, stdout, stderr io.Writer) error {
	audit, err := openAudit(cfg, a, stderr)
	if err != nil {
		return err
	}
	conn, err := dial(cfg, "dlq-replay")
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := guardDLQ(cfg, conn, a.spend, stderr); err != nil {
		return fmt.Errorf("dlq replay: %w", err)
	}
	if !a.includeOld {
		a.filter.FailedAfter = time.Now().Add(-cfg.InboxTTL)
	}
	before := countDLQ(cfg, 0)
	pace := dlq.Pace{Rate: float64(a.rate)}
	var prog *progressLine
	if terminalOut(stderr) && !a.dryRun {
		prog = &progressLine{w: stderr}
		pace.Progress = prog.show
	}
	r, err := dlq.ReplayPaced(ctx, conn, cfg.Prefix, a.filter, a.limit, a.dryRun,
		dlq.Custody{Replayers: strings.Split(cfg.Replayers, ",")}, pace)
	prog.end()
	err = noDLQ(cfg, err)
	verb := "replayed"
	if a.dryRun {
		verb = "would replay"
	}
	fmt.Fprintf(stdout, "scanned %d of the %d dead letter(s) the DLQ held at the start, %s %d\n",
		r.Scanned, r.Depth, verb, len(r.Replayed))
	if !a.dryRun && len(r.Replayed) > 0 {
		fmt.Fprintf(stdout, "replay run %s: in header %s of each letter it put back, also of one that failed again\n",
			r.Run, dlq.HeaderReplayRun)
	}
	if r.TooOld+r.Undated > 0 {
		fmt.Fprintf(stdout, "left alone: %d that failed longer ago than INBOX_TTL, %d that show no failure time (--include-older-than-ttl replays them)\n",
			r.TooOld, r.Undated)
	}
	if len(r.Unreplayable) > 0 {
		var counts, names []string
		for _, class := range dlq.Classes() {
			if n := r.Unreplayable[class]; n > 0 {
				counts = append(counts, fmt.Sprintf("%d %s", n, class))
				names = append(names, "--class "+class)
			}
		}
		fmt.Fprintf(stdout, "left alone: %s, which cannot apply again (name %s to replay them)\n",
			strings.Join(counts, ", "), strings.Join(names, " or "))
	}
	printLetters(stdout, r.Replayed)
	before.againstScanned(r.Depth).printUnseen(stdout)
	if err == nil && r.Interrupted {
		err = fmt.Errorf("dlq replay interrupted (%v): %d replayed, each confirmed and removed from the DLQ; "+
			"every other letter is still in the DLQ: run again to go on", context.Cause(ctx), len(r.Replayed))
	}
	return audit.write(dlq.ReplayRun(r, dlq.Queue(cfg.Prefix)), a, conn, err)
}

// rateFlag is --rate: letters per second, written N or N/s; 0 for as fast
// as the broker confirms.
type rateFlag float64

func (r *rateFlag) String() string { return strconv.FormatFloat(float64(*r), 'g', -1, 64) + "/s" }

func (r *rateFlag) Set(s string) error {
	n, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(s), "/s"), 64)
	if err != nil || n < 0 {
		return fmt.Errorf("not a rate: want letters per second, such as 50 or 50/s (0: no limit)")
	}
	*r = rateFlag(n)
	return nil
}

// terminalOut reports whether w is a terminal, where a progress line that
// rewrites itself can be read.
func terminalOut(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progressLine shows a replay's progress on one line that it rewrites, at
// most five times a second, and as it was last when the run ends.
type progressLine struct {
	w      io.Writer
	last   time.Time
	latest dlq.Progress
	told   bool // latest is not on the line yet
}

func (p *progressLine) show(pr dlq.Progress) {
	p.latest, p.told = pr, true
	if time.Since(p.last) < 200*time.Millisecond {
		return
	}
	p.last, p.told = time.Now(), false
	fmt.Fprintf(p.w, "\r%s", progressText(pr))
}

// end writes the progress as it was last, if it was ever told any, and
// ends the line.
func (p *progressLine) end() {
	if p == nil || p.last.IsZero() && !p.told {
		return
	}
	if p.told {
		fmt.Fprintf(p.w, "\r%s", progressText(p.latest))
	}
	fmt.Fprintln(p.w)
}

// progressText says how far a replay is: done, what is left to read of
// what the DLQ held at the start, and the rate.
func progressText(pr dlq.Progress) string {
	return fmt.Sprintf("replayed %d, %d of %d letter(s) left to read, %.1f/s   ",
		pr.Replayed, max(0, pr.Depth-pr.Scanned), pr.Depth, pr.Rate())
}
