package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// printScale prints what a scale run measured: the prefills, each drain,
// the medians against the empty database, the split by relation, and
// retention.
func printScale(w io.Writer, r scaleResult) {
	s := r.Settings
	fmt.Fprintf(w, "PostgreSQL %s: checkpoint_timeout=%s max_wal_size=%s wal_compression=%s shared_buffers=%s autovacuum=%s\n",
		r.Server, s.CheckpointTimeout, s.MaxWALSize, s.WALCompression, s.SharedBuffers, s.Autovacuum)
	ids := r.IDs
	if ids == "" {
		ids = "random" // results from before -ids
	}
	fmt.Fprintf(w, "%d events per drain over %d queues and %d accounts; %s ids; INBOX_TTL %s; load at start %s\n\n",
		r.Events, r.Queues, r.Accounts, ids, r.InboxTTL, r.Load)
	if r.CompleteAfter > 0 || r.TransferFillfactor > 0 {
		fmt.Fprintf(w, "half the events complete a creation %d creations earlier (0: none); transfer fillfactor %d (0: default)\n\n",
			r.CompleteAfter, r.TransferFillfactor)
	}

	if len(r.Loads) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "prefill rows\ttransfers\tinbox s\ttransfers s\tbalances s\tindexes s\tvacuum analyze s\tcheckpoint s\ttotal s\tinbox MiB\ttransfer MiB\tdatabase MiB\t")
		for _, l := range r.Loads {
			fmt.Fprintf(tw, "%d\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t\n", l.Rows, l.Transfers,
				l.InboxSeconds, l.TransfersSeconds, l.BalancesSeconds, l.IndexSeconds, l.VacuumSeconds, l.CheckpointSeconds,
				l.TotalSeconds, mb(l.InboxBytes), mb(l.TransferBytes), mb(l.DatabaseBytes))
		}
		tw.Flush()
		fmt.Fprintln(w)
	}

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "inbox rows\tBATCH_MAX\tsetting\tround\tevents/s\tWAL B/event\tFPI/event\tpg_stat_wal FPI/event\tcheckpoints in drain\tdrain s\t")
	for _, d := range r.Drains {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%.0f\t%.0f\t%.2f\t%.2f\t%d\t%.0f\t\n", d.Rows, d.BatchMax, settingOf(d), d.Round, d.EventsPerSec,
			d.WALPerEvent, d.FPIPerEvent, float64(d.WAL.StatFPI)/float64(d.Events), d.WAL.Checkpoints, d.WAL.Seconds)
	}
	tw.Flush()

	// Medians of the rounds, against the empty database's with the same
	// BATCH_MAX.
	type key struct {
		rows, batch int
		setting     string
	}
	var keys []key
	seen := map[key]bool{}
	group := map[key][]drainResult{}
	for _, d := range r.Drains {
		k := key{d.Rows, d.BatchMax, d.Setting}
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
		group[k] = append(group[k], d)
	}
	med := func(k key, f func(drainResult) float64) float64 {
		var v []float64
		for _, d := range group[k] {
			v = append(v, f(d))
		}
		return medianOf(v)
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "inbox rows\tBATCH_MAX\tsetting\truns\tevents/s (median)\tWAL B/event\tFPI/event\tWAL ×empty\tevents/s ×empty\tinbox WAL B/event\tinbox ×empty\t")
	rate := func(d drainResult) float64 { return d.EventsPerSec }
	wal := func(d drainResult) float64 { return d.WALPerEvent }
	fpi := func(d drainResult) float64 { return d.FPIPerEvent }
	inbox := func(d drainResult) float64 {
		var b int64
		for _, rel := range d.WAL.Relations {
			// The table, its two indexes, and each partition's (adr/0011).
			if rel.Name == "processed_event" || strings.HasPrefix(rel.Name, "processed_event_") {
				b += rel.Bytes
			}
		}
		return float64(b) / float64(d.Events)
	}
	for _, k := range keys {
		e := key{0, k.batch, k.setting}
		ratio := func(f func(drainResult) float64) string {
			if !seen[e] || med(e, f) == 0 {
				return "—"
			}
			return fmt.Sprintf("%.2f", med(k, f)/med(e, f))
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%.0f\t%.0f\t%.2f\t%s\t%s\t%.0f\t%s\t\n", k.rows, k.batch, orDefault(k.setting), len(group[k]),
			med(k, rate), med(k, wal), med(k, fpi), ratio(wal), ratio(rate), med(k, inbox), ratio(inbox))
	}
	tw.Flush()

	fmt.Fprintln(w, "\nWAL by relation, first round (a record counts for the relation of its first block; FPI for each block's):")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "inbox rows\tBATCH_MAX\tsetting\trelation\tB/event\tFPI/event\trecords/event\tshare\t")
	for _, d := range r.Drains {
		if d.Round != 1 {
			continue
		}
		for i, rel := range d.WAL.Relations {
			if i == 8 {
				break
			}
			share := 0.0
			if d.WAL.DumpLen > 0 {
				share = 100 * float64(rel.Bytes) / float64(d.WAL.DumpLen)
			}
			n := float64(d.Events)
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%.0f\t%.3f\t%.2f\t%.0f%%\t\n", d.Rows, d.BatchMax, settingOf(d), rel.Name,
				float64(rel.Bytes)/n, float64(rel.FPI)/n, float64(rel.Records)/n, share)
		}
	}
	tw.Flush()

	if len(r.Prunes) > 0 {
		fmt.Fprintln(w, "\nRetention over the rows older than INBOX_TTL after a CHECKPOINT: the owner's maintenance (migrate) and the service's prune, then VACUUM processed_event:")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "inbox rows\tdeleted\tprune s\trows/s\tprune WAL B/row\tFPI/row\tvacuum s\tvacuum WAL B/row\tFPI/row\ttogether B/row\t")
		for _, p := range r.Prunes {
			n := float64(max(p.Deleted, 1))
			fmt.Fprintf(tw, "%d\t%d\t%.1f\t%.0f\t%.0f\t%.3f\t%.1f\t%.0f\t%.3f\t%.0f\t\n", p.Rows, p.Deleted, p.PruneSeconds,
				float64(p.Deleted)/p.PruneSeconds, p.WALPerRow, float64(p.Prune.FPI)/n, p.VacuumSeconds,
				p.VacuumPerRow, float64(p.Vacuum.FPI)/n, p.WALPerRow+p.VacuumPerRow)
		}
		tw.Flush()
	}
	for _, p := range r.Reconciles {
		fmt.Fprintf(w, "\nReconciliation at %d rows: one pass in %.1f s, exit %d\n", p.Rows, p.Seconds, p.ExitCode)
	}
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }

func settingOf(d drainResult) string { return orDefault(d.Setting) }

func orDefault(setting string) string {
	if setting == "" {
		return "as started"
	}
	return setting
}
