-- Made before the numbered migrations, which may call it.
-- reconcile_checkpoint_stamp is the trigger, BEFORE UPDATE of each row of
-- reconcile_checkpoint (sql/0019), that stamps the row with the
-- transaction writing it (written_by), so that the checkpoint can tell it
-- was written here and not copied in (written_here, adr/0007): every
-- update of it, a pass's, a standby's claim of the full pass, a person's
-- mark, keeps its xmin and its stamp one transaction.
--
-- Only a row written here is stamped again. A copied row stays copied
-- until a pass writes a cut-off of this cluster into it (which sets
-- written_by itself): a claim or a person's mark on a checkpoint restored
-- from another cluster must not make it look like this cluster's. A
-- plpgsql body names its table only when it runs, after sql/0016 made it.

CREATE OR REPLACE FUNCTION reconcile_checkpoint_stamp() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.written_by IS DISTINCT FROM OLD.written_by
       OR (SELECT written_here(c.xmin, c.written_by) FROM reconcile_checkpoint c) THEN
        NEW.written_by := pg_current_xact_id();
    END IF;
    RETURN NEW;
END
$$;
