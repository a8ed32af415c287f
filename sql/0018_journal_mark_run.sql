-- What lets a queue's lane trust its journal mark without reading the
-- journal (adr/0014, "What is trusted"), now that it must survive every
-- restore an operator does. Until this migration the mark's row recorded
-- which database a read had synced it in (sql/0017: the cluster, the
-- database, journal_mark's file, the timeline) and compared that with the
-- database as it is. A restore that keeps all four (a volume snapshot or
-- a cold copy put back, a pg_basebackup started as it is, a data-only
-- restore) brought the record back with the rows, and the database vouched
-- for commits it had lost: acked events were never applied again.
--
-- Now the row records when the server it was written in started
-- (vouched_run), beside the transaction that wrote it (vouched_by), and
-- journal_mark_doubt trusts it only in the same run of the server, written
-- by that very transaction (its xmin). Every restore above starts the
-- server again or writes the row anew; neither is brought back by it.
--
-- A release before this one, during a rolling deploy, still records the
-- four (Vouch, sql/0017) after a read: the trigger below turns that into
-- this record, so that its lanes go on; its start without a read
-- (Vouched) finds the four empty and waits for the journal, as it should.
-- Rows vouched for before this migration have no run: each queue's first
-- transaction after it reads the journal once. Written to run again
-- harmlessly.

ALTER TABLE journal_mark ADD COLUMN IF NOT EXISTS vouched_run TIMESTAMPTZ;

DROP TRIGGER IF EXISTS journal_mark_vouched_before ON journal_mark;
CREATE TRIGGER journal_mark_vouched_before BEFORE INSERT OR UPDATE ON journal_mark
    FOR EACH ROW
    WHEN (NEW.vouched_system IS NOT NULL OR NEW.vouched_database IS NOT NULL
          OR NEW.vouched_file IS NOT NULL OR NEW.vouched_timeline IS NOT NULL)
    EXECUTE FUNCTION journal_mark_vouched_before();
