package reconcile

import (
	"context"
	"time"

	"github.com/jmoiron/sqlx"
)

// The checkpoint, as a pass reads and judges it (checkpointQuery; its
// other queries are in checkpoint_sql.go).

// Checkpoint is what a pass made of the checkpoint it found.
type Checkpoint struct {
	// Present: there is one, or there was until a pass forgot it
	// (Broken says why).
	Present bool `json:"present"`
	// WrittenAt is when the pass that wrote it ran: its cut-off.
	WrittenAt *time.Time `json:"written_at,omitempty"`
	// Broken says why the checkpoint means nothing in this database (its
	// transaction ids are another history's); Distrusted why it is made
	// anew though comparable. Both empty: the periodic pass starts from
	// it.
	Broken     string `json:"broken,omitempty"`
	Distrusted string `json:"distrusted,omitempty"`
	// Neutralized: the rows of transfer and transfer_failure whose
	// transaction ids this pass found another cluster's and neutralized,
	// before its snapshot; the checkpoint was forgotten then (Broken).
	Neutralized int64 `json:"neutralized,omitempty"`
	// Compared: the full pass compared the transfers with it; Differs:
	// the accounts whose transfers it found no longer summing to it
	// (each kept as a finding of Changed).
	Compared bool `json:"compared"`
	Differs  int  `json:"differs"`
	// Rebuilt: this pass made it anew.
	Rebuilt bool `json:"rebuilt"`
	// RebuiltAt and FullAt: when it was last made anew, and when the last
	// full pass before this one ended, on whichever server it read.
	RebuiltAt *time.Time `json:"rebuilt_at,omitempty"`
	FullAt    *time.Time `json:"last_full_at,omitempty"`

	cutoff     *string // the snapshot, as text
	cutoffXmin *int64
	sweptTo    string
}

// madeAt is when c was made anew last, which names the changed findings
// found against it (changedSubject); when it was written, for one
// without.
func (c Checkpoint) madeAt() *time.Time {
	if c.RebuiltAt != nil {
		return c.RebuiltAt
	}
	return c.WrittenAt
}

// trusted reports whether the periodic pass may start from c.
func (c Checkpoint) trusted() bool { return c.Present && c.Broken == "" && c.Distrusted == "" }

// comparable returns the cut-off and its xmin to compare the transfers
// with, both nil when c means nothing here.
func (c Checkpoint) comparable() (*string, *int64) {
	if !c.Present || c.Broken != "" {
		return nil, nil
	}
	return c.cutoff, c.cutoffXmin
}

// readCheckpoint reads the checkpoint and judges it (checkpointQuery).
func readCheckpoint(ctx context.Context, tx *sqlx.Tx) (Checkpoint, error) {
	var row struct {
		Cutoff     *string    `db:"cutoff"`
		Forgotten  *string    `db:"forgotten"`
		WrittenAt  *time.Time `db:"written_at"`
		RebuiltAt  *time.Time `db:"rebuilt_at"`
		FullAt     *time.Time `db:"full_at"`
		SweptTo    string     `db:"swept_to"`
		Xmin       *int64     `db:"cutoff_xmin"`
		Broken     *string    `db:"broken"`
		Distrusted *string    `db:"distrusted"`
	}
	if err := tx.GetContext(ctx, &row, checkpointQuery); err != nil {
		return Checkpoint{}, translateIn("read the checkpoint", err)
	}
	c := Checkpoint{Present: row.Cutoff != nil || row.Forgotten != nil, WrittenAt: row.WrittenAt, RebuiltAt: row.RebuiltAt, FullAt: row.FullAt,
		cutoff: row.Cutoff, cutoffXmin: row.Xmin, sweptTo: row.SweptTo}
	if row.Broken != nil {
		c.Broken = *row.Broken
	}
	if row.Distrusted != nil {
		c.Distrusted = *row.Distrusted
	}
	return c, nil
}
