-- journal_mark_doubt says why a queue's journal mark may not be trusted
-- without reading the journal, or NULL when it may (adr/0014, "What is
-- trusted"). Its arguments are the mark row's xmin, vouched_by and
-- vouched_run (sql/0018_journal_mark_run.sql).
--
-- The mark is trusted when its row was last written, in this run of the
-- server (pg_postmaster_start_time()), by a read of the journal that
-- synced the queue (db's Vouch) or by a transaction that moved it on from
-- a mark so trusted (journal_advance), and by that very transaction
-- (written_here). Then the database has lost none of the queue's commits
-- since a read of the journal last synced it: with fsync and a durable
-- commit (journal_advance and Vouch raise synchronous_commit), a commit is
-- lost only when the server's files are put back or replaced (a volume
-- snapshot or a cold copy put back, a pg_basebackup, a point-in-time
-- restore, a promoted standby, a dump restored elsewhere), and each of
-- those starts the server again; or when the rows themselves are written
-- again (a data-only restore, a copy), which changes their xmin. Nothing
-- of this is read from what a restore brings back: the run is the
-- server's, the xmin the row's own. A restart that lost nothing costs a
-- read of the journal per queue.
--
-- One SQL expression, inlined where it is called: journal_advance asks it
-- of every transaction that moves a mark.

CREATE OR REPLACE FUNCTION journal_mark_doubt(p_xmin xid, p_by xid8, p_run timestamptz) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN p_by IS NULL OR p_run IS NULL
            THEN 'no read of the journal has synced it since it was made, since a restore moved it, or since this release'
        WHEN p_run <> pg_postmaster_start_time()
            THEN 'it was last synced while the server ran from ' || p_run || ', and the server has started again since '
                 '(a restart, a failover, or a restore), so the database may have lost commits of the queue'
        WHEN NOT written_here(p_xmin, p_by)
            THEN 'its row was written by another transaction than the one it names: it was copied or restored in'
    END
$$;
