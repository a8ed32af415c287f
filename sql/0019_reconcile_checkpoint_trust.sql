-- Why a pass forgot the reconciliation's checkpoint (adr/0007, "Another
-- cluster's transaction ids").
--
-- forgotten: why the cut-off was set to NULL other than by a pass that
-- made the checkpoint: a pass that neutralized transaction ids of another
-- cluster in transfer or transfer_failure. Read only while the cut-off
-- is NULL; a pass that makes the checkpoint anew clears it. A release
-- before this one sees a NULL cut-off as no checkpoint, and makes it anew
-- too. Written to run again harmlessly.

ALTER TABLE reconcile_checkpoint ADD COLUMN IF NOT EXISTS forgotten TEXT;
