-- The reconciliation's checkpoint tells by itself whether it was written
-- here (adr/0007, "When the checkpoint is not trusted"), and says why a
-- pass forgot it.
--
-- Its trust no longer rests on the cluster's system identifier (which a
-- role may not be allowed to read), the timeline, or the status of the
-- transaction that wrote it (unknown once the status log is truncated):
-- the row was written here when its xmin is the transaction stamped in
-- written_by (written_here). The trigger stamps every update of it,
-- whoever makes it (reconcile_checkpoint_stamp); a copy of the row, by
-- pg_restore or by logical replication, fires no trigger, and so is told
-- apart. system_identifier and timeline are no longer read or written;
-- they stay for a release before this one during a rolling deploy.
--
-- forgotten: why the cut-off was set to NULL other than by a pass that
-- made the checkpoint: a pass that neutralized transaction ids of another
-- cluster in transfer or transfer_failure. Read only while the cut-off
-- is NULL; a pass that makes the checkpoint anew clears it. A release
-- before this one sees a NULL cut-off as no checkpoint, and makes it anew
-- too.
--
-- transfer_failure has no primary key (a B-tree would cost every failure
-- an entry, sql/0016), and a table of a publication (FOR ALL TABLES, as
-- for a move by logical replication) refuses any UPDATE without a replica
-- identity, even one that changes no row: the neutralization's would fail
-- every pass on the source. REPLICA IDENTITY FULL costs an insert nothing
-- (it writes the old row to the WAL at an update or a delete, which only
-- a neutralization makes).
--
-- The checkpoint written by the release before is stamped once here when
-- that release's own checks still hold (the same cluster, and its
-- transaction committed here), so that the upgrade does not cost a full
-- pass; otherwise the next pass is a full one that makes it anew. This is
-- the last read of system_identifier. Written to run again harmlessly.

ALTER TABLE reconcile_checkpoint ADD COLUMN IF NOT EXISTS forgotten TEXT;
ALTER TABLE transfer_failure REPLICA IDENTITY FULL;

UPDATE reconcile_checkpoint SET written_by = pg_current_xact_id()
WHERE cutoff IS NOT NULL
  AND CASE WHEN written_by < pg_snapshot_xmax(pg_current_snapshot()) THEN pg_xact_status(written_by) END = 'committed'
  AND system_identifier = CASE WHEN has_function_privilege('pg_control_system()', 'execute')
                               THEN (SELECT system_identifier FROM pg_control_system()) END
  AND NOT written_here(xmin, written_by);

DROP TRIGGER IF EXISTS reconcile_checkpoint_stamp ON reconcile_checkpoint;
CREATE TRIGGER reconcile_checkpoint_stamp BEFORE UPDATE ON reconcile_checkpoint
    FOR EACH ROW EXECUTE FUNCTION reconcile_checkpoint_stamp();
