package main

import (
	"bufio"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// walRange is the WAL written between two moments: by the LSN's advance,
// by pg_stat_wal (the whole cluster's counters), and by pg_waldump's
// reading of the range, record by record.
type walRange struct {
	StartLSN string `json:"start_lsn"`
	// The segment holding StartLSN: pg_waldump reads the segment size from
	// it (left to itself, it may pick a preallocated, still empty segment).
	StartFile string `json:"start_file"`
	EndFile   string `json:"end_file"`
	EndLSN    string `json:"end_lsn"`
	// pg_wal_lsn_diff(end, start): every byte of WAL, page headers included.
	Bytes int64 `json:"bytes"`
	// pg_stat_wal's counters over the same moments (read once the
	// measured processes have exited, so that their counts are in).
	StatRecords int64 `json:"stat_records"`
	StatFPI     int64 `json:"stat_fpi"`
	StatBytes   int64 `json:"stat_bytes"`
	// From pg_waldump over [start, end): records, their total length, and
	// the full-page images among their block references.
	Records int64 `json:"records"`
	DumpLen int64 `json:"dump_bytes"`
	FPI     int64 `json:"fpi"`
	// Checkpoints that started within the range (pg_stat_bgwriter, timed
	// and requested).
	Checkpoints int64    `json:"checkpoints"`
	Relations   []relWAL `json:"relations"`
	// Why Records, DumpLen, FPI and Relations are missing, when pg_waldump
	// could not read the range: its first segment recycled, when the range
	// outgrew max_wal_size and wal_keep_size. The LSN's advance and
	// pg_stat_wal's counters still hold.
	DumpError string     `json:"dump_error,omitempty"`
	Seconds   float64    `json:"seconds"`
	start     walCounter // not written: the counters at the start
}

// relWAL is one relation's share of a range: the records whose first block
// is in it (their whole length, images included), and the full-page images
// of its blocks, whichever record took them. Records without a block are
// counted under their resource manager, e.g. "(Transaction)".
type relWAL struct {
	Name    string `json:"name"`
	Records int64  `json:"records"`
	Bytes   int64  `json:"bytes"`
	FPI     int64  `json:"fpi"`
}

type walCounter struct {
	lsn, file           string
	records, fpi, bytes int64
	checkpoints         int64
}

func readWALCounter(db *sql.DB) (walCounter, error) {
	var c walCounter
	err := db.QueryRow(`SELECT pg_current_wal_lsn()::text, pg_walfile_name(pg_current_wal_lsn() + 1), w.wal_records, w.wal_fpi, w.wal_bytes::bigint,
		b.checkpoints_timed + b.checkpoints_req
		FROM pg_stat_wal w, pg_stat_bgwriter b`).Scan(&c.lsn, &c.file, &c.records, &c.fpi, &c.bytes, &c.checkpoints)
	return c, err
}

// beginWAL marks the start of a measured range.
func beginWAL(db *sql.DB) (walRange, error) {
	c, err := readWALCounter(db)
	return walRange{StartLSN: c.lsn, StartFile: c.file, start: c}, err
}

// endLSN marks the range's end: called the moment the measured work is done.
func (w *walRange) endLSN(db *sql.DB) error {
	if err := db.QueryRow(`SELECT l::text, pg_walfile_name(l), pg_wal_lsn_diff(l, $1)::bigint FROM pg_current_wal_lsn() l`,
		w.StartLSN).Scan(&w.EndLSN, &w.EndFile, &w.Bytes); err != nil {
		return err
	}
	return nil
}

// finish reads pg_stat_wal again and splits the range by relation with
// pg_waldump; names maps "database oid/relfilenode" to a relation's name.
func (w *walRange) finish(db *sql.DB, p *pgServer, names map[string]string) error {
	c, err := readWALCounter(db)
	if err != nil {
		return err
	}
	w.StatRecords, w.StatFPI, w.StatBytes = c.records-w.start.records, c.fpi-w.start.fpi, c.bytes-w.start.bytes
	w.Checkpoints = c.checkpoints - w.start.checkpoints
	return w.dump(p, names)
}

var (
	dumpRmgr   = regexp.MustCompile(`^rmgr: (\S+)\s+len \(rec/tot\):\s*\d+/\s*(\d+),`)
	dumpBlkref = regexp.MustCompile(`blkref #\d+: rel (\d+)/(\d+)/(\d+)(?: fork \w+)? blk \d+( FPW)?`)
)

func (w *walRange) dump(p *pgServer, names map[string]string) error {
	if w.StartLSN == w.EndLSN {
		return nil
	}
	cmd := exec.Command(filepath.Join(p.bin, "pg_waldump"), "-p", filepath.Join(p.data, "pg_wal"), "-s", w.StartLSN, "-e", w.EndLSN, w.StartFile, w.EndFile)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	rels := map[string]*relWAL{}
	get := func(name string) *relWAL {
		r := rels[name]
		if r == nil {
			r = &relWAL{Name: name}
			rels[name] = r
		}
		return r
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		m := dumpRmgr.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		tot, _ := strconv.ParseInt(m[2], 10, 64)
		w.Records++
		w.DumpLen += tot
		refs := dumpBlkref.FindAllStringSubmatch(line, -1)
		owner := "(" + m[1] + ")"
		for i, ref := range refs {
			name := names[ref[2]+"/"+ref[3]]
			if name == "" {
				name = "other " + ref[1] + "/" + ref[2] + "/" + ref[3]
			}
			if i == 0 {
				owner = name
			}
			if ref[4] != "" {
				get(name).FPI++
				w.FPI++
			}
		}
		r := get(owner)
		r.Records++
		r.Bytes += tot
	}
	// pg_waldump ends with an error when the range ends inside a record
	// being written: what it read is still right.
	if err := cmd.Wait(); err != nil && w.Records == 0 {
		w.DumpError = fmt.Sprintf("pg_waldump: %v: %s", err, strings.TrimSpace(stderr.String()))
		fmt.Fprintf(os.Stderr, "scale: no split by relation for %s..%s (raise -wal-keep-size): %s\n", w.StartLSN, w.EndLSN, w.DumpError)
		return nil
	}
	for _, r := range rels {
		w.Relations = append(w.Relations, *r)
	}
	sort.Slice(w.Relations, func(i, j int) bool { return w.Relations[i].Bytes > w.Relations[j].Bytes })
	return nil
}

// relationNames maps each relation of the database db is connected to, by
// "database oid/relfilenode" as pg_waldump prints it, to its name (a TOAST
// table's as "toast of TABLE").
func relationNames(db *sql.DB) (map[string]string, error) {
	rows, err := db.Query(`
		SELECT d.oid::text || '/' || pg_relation_filenode(c.oid)::text,
		       coalesce('toast of ' || t.relname, c.relname)
		FROM pg_class c
		CROSS JOIN (SELECT oid FROM pg_database WHERE datname = current_database()) d
		LEFT JOIN pg_class t ON t.reltoastrelid = c.oid
		WHERE pg_relation_filenode(c.oid) IS NOT NULL`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	names := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, err
		}
		names[k] = v
	}
	return names, rows.Err()
}
