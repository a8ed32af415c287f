-- journal_vouched_here says whether a read of the journal vouched for the
-- queue's mark row m (Vouch, sql/0017_journal_mark_vouched.sql) in this
-- very database as it is now: the same cluster, journal_mark file and
-- timeline, and a vouching transaction this database has reached. Then
-- the database has lost no commit of the queue since, whoever made it,
-- within PostgreSQL's durability on one timeline. journal_advance
-- requires it of every transaction that moves the mark (adr/0014, "A
-- handover across a failover"), so it reads no file and no catalog
-- table: the cluster's identifier (pg_control_system reads the control
-- file) is read once per session and kept in a setting, since a session's
-- server never changes; the database's oid adds nothing the table's file
-- does not say. What a role may not read is 0 or NULL at the vouch as
-- now, and so compares equal: such an estate cannot see a failover here.

CREATE OR REPLACE FUNCTION journal_vouched_here(m journal_mark) RETURNS BOOLEAN
LANGUAGE plpgsql AS $$
DECLARE
    sysid TEXT := current_setting('transferconsumer.system_identifier', true);
BEGIN
    IF m.vouched_by IS NULL THEN
        RETURN false;
    END IF;
    IF coalesce(sysid, '') = '' THEN
        SELECT h.system::text INTO sysid FROM journal_here() h;
        PERFORM set_config('transferconsumer.system_identifier', sysid, false);
    END IF;
    RETURN m.vouched_system = sysid::bigint
        AND m.vouched_file IS NOT DISTINCT FROM pg_relation_filenode('journal_mark')::bigint
        AND m.vouched_timeline IS NOT DISTINCT FROM journal_timeline()
        AND m.vouched_by < pg_snapshot_xmax(pg_current_snapshot());
END $$;
