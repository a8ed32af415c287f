-- journal_vouched_here says whether a read of the journal vouched for the
-- queue's mark row m (Vouch, sql/0017_journal_mark_vouched.sql) in this
-- very database as it is now: the same cluster, journal_mark file and
-- timeline, and a vouching transaction this database has reached. Then
-- the database has lost no commit of the queue since, whoever made it,
-- within PostgreSQL's durability on one timeline. journal_advance
-- requires it of every transaction that moves the mark (adr/0014, "A
-- handover across a failover"), so it is kept cheap: the cluster's
-- identifier and the timeline are read once per session, once the server
-- is a primary, and kept in a setting (pg_control_system reads the
-- control file, and the timeline's expression parses two function
-- signatures: together some 45 µs a transaction here); a session's server
-- never changes, and a primary's timeline never changes under its
-- sessions (only a standby's promotion starts one). The file is read each
-- time: a restore may TRUNCATE the table under a session. The database's
-- oid adds nothing the table's file does not say. What a role may not
-- read is 0 or NULL at the vouch as now, and so compares equal: such an
-- estate cannot see a failover here.

CREATE OR REPLACE FUNCTION journal_vouched_here(m journal_mark) RETURNS BOOLEAN
LANGUAGE plpgsql AS $$
DECLARE
    kept TEXT := current_setting('transferconsumer.journal_here', true);
    h    RECORD;
BEGIN
    IF m.vouched_by IS NULL THEN
        RETURN false;
    END IF;
    IF coalesce(kept, '') = '' THEN
        SELECT * INTO h FROM journal_here();
        IF h.timeline IS NULL THEN
            -- A standby, or a role that may not read the timeline: kept
            -- for nothing, so that a promotion is seen.
            RETURN (m.vouched_system, m.vouched_file, m.vouched_timeline) IS NOT DISTINCT FROM (h.system, h.file, h.timeline)
                AND m.vouched_by < pg_snapshot_xmax(pg_current_snapshot());
        END IF;
        kept := h.system || '/' || h.timeline;
        PERFORM set_config('transferconsumer.journal_here', kept, false);
    END IF;
    RETURN m.vouched_system = split_part(kept, '/', 1)::bigint
        AND m.vouched_timeline = split_part(kept, '/', 2)::bigint
        AND m.vouched_file IS NOT DISTINCT FROM pg_relation_filenode('journal_mark')::bigint
        AND m.vouched_by < pg_snapshot_xmax(pg_current_snapshot());
END $$;
