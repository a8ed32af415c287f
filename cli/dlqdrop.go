package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"transferconsumer/config"
	"transferconsumer/dlq"
)

// dropCommand runs dlq drop. Everything that can refuse without the broker
// does so first: no terminal to confirm on, a record file it cannot open.
// Then, unless --yes, it shows what a dry run finds and asks; what it drops
// is at most as many letters as it showed, each recorded before it goes.
// With --record - the records go to stdout and everything else to stderr.
func dropCommand(cfg config.Config, a dlqArgs, stdin io.Reader, stdout, stderr io.Writer) error {
	report := stdout
	var rec dlq.Recorder
	where := a.record
	if !a.dryRun {
		if !a.yes && !terminal(stdin) {
			return errors.New("dlq drop: stdin is not a terminal to confirm on: nothing dropped; pass --yes to drop without asking")
		}
		w := stdout
		if a.record == "-" {
			report, where = stderr, "stdout"
		} else {
			f, err := openRecord(a.record)
			if err != nil {
				return fmt.Errorf("dlq drop: nothing dropped: %w", err)
			}
			defer f.Close()
			w = f
		}
		rec = dlq.Lines{W: w, Queue: dlq.Queue(cfg.Prefix)}
	}
	audit, err := openAudit(cfg, a, report)
	if err != nil {
		return err
	}
	conn, err := dial(cfg, "dlq-drop")
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := guardDLQ(cfg, conn, a.spend, stderr); err != nil {
		return fmt.Errorf("dlq drop: %w", err)
	}

	before := countDLQ(cfg, 0)
	limit := a.limit
	if !a.dryRun && !a.yes {
		preview, err := dlq.Drop(conn, cfg.Prefix, a.filter, a.limit, true, nil)
		if err != nil {
			return noDLQ(cfg, err)
		}
		if len(preview.Dropped) == 0 {
			fmt.Fprintf(report, "scanned %d of the %d dead letter(s) the DLQ held at the start, none to drop\n",
				preview.Scanned, preview.Depth)
			before.againstScanned(preview.Depth).printUnseen(report)
			return nil
		}
		printLetters(report, preview.Dropped)
		ok, err := confirm(stdin, report, fmt.Sprintf("\nDrop these %d letter(s) from %s for good, recording them to %s? Type yes to drop: ",
			len(preview.Dropped), dlq.Queue(cfg.Prefix), where))
		if err != nil {
			return err
		}
		if !ok {
			fmt.Fprintln(report, "nothing dropped")
			return nil
		}
		limit = len(preview.Dropped)
	}

	r, err := dlq.Drop(conn, cfg.Prefix, a.filter, limit, a.dryRun, rec)
	err = noDLQ(cfg, err)
	verb := "dropped"
	if a.dryRun {
		verb = "would drop"
	}
	fmt.Fprintf(report, "scanned %d of the %d dead letter(s) the DLQ held at the start, %s %d\n",
		r.Scanned, r.Depth, verb, len(r.Dropped))
	if !a.dryRun && len(r.Dropped) > 0 {
		fmt.Fprintf(report, "each recorded in %s before it was removed\n", where)
	}
	printLetters(report, r.Dropped)
	before.againstScanned(r.Depth).printUnseen(report)
	return audit.write(dlq.DropRun(r, dlq.Queue(cfg.Prefix)), a, conn, err)
}

// terminal reports whether someone can answer a question on stdin: a file
// that is a character device (a terminal; /dev/null too, which then reads as
// closed). A pipe or a regular file is not asked: what it holds was not
// written in answer. A reader that is not a file (a test's) is answered as a
// terminal.
func terminal(stdin io.Reader) bool {
	f, ok := stdin.(*os.File)
	if !ok {
		return stdin != nil
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// confirm writes question to w and reads one line from stdin: true for
// "yes" or "y", false for anything else. A stdin that ends before a line is
// an error: nobody answered.
func confirm(stdin io.Reader, w io.Writer, question string) (bool, error) {
	fmt.Fprint(w, question)
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil && (!errors.Is(err, io.EOF) || line == "") {
		fmt.Fprintln(w)
		return false, fmt.Errorf("dlq drop: no answer on stdin (%v): nothing dropped; pass --yes to drop without asking", err)
	}
	switch strings.TrimSpace(line) {
	case "yes", "y":
		return true, nil
	}
	return false, nil
}

// openRecord opens the record file for appending, creating it readable by
// its owner alone (it holds the letters' bodies). A new file's directory is
// synced, so that the file itself outlives a crash along with its records.
func openRecord(name string) (*os.File, error) {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		f, err = os.OpenFile(name, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return nil, fmt.Errorf("open the record file: %w", err)
		}
		return f, nil
	}
	if err != nil {
		return nil, fmt.Errorf("create the record file: %w", err)
	}
	if dir, err := os.Open(filepath.Dir(name)); err == nil {
		err = dir.Sync()
		dir.Close()
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("sync the record file's directory: %w", err)
		}
	}
	return f, nil
}
