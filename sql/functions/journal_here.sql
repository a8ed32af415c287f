-- journal_here is this database as a journal mark's voucher records it
-- (sql/0017_journal_mark_vouched.sql, adr/0014): the cluster's system
-- identifier (0 when the role may not read it), this database's oid, the
-- file of journal_mark, and the timeline (journal_timeline). A failover
-- or a point-in-time restore changes the timeline; a logical restore the
-- cluster, the database or the file. A set-returning SQL function, so
-- that a query that reads it in FROM has it inlined. This release does
-- not call it (sql/0018: a restore that keeps all four brought the record
-- back with the rows); a release before 0018 does, when a read syncs a
-- queue during a rolling deploy, and the trigger of 0018 turns what it
-- records into this release's.

CREATE OR REPLACE FUNCTION journal_here() RETURNS TABLE (system BIGINT, database BIGINT, file BIGINT, timeline BIGINT)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(CASE WHEN has_function_privilege('pg_control_system()', 'execute')
               THEN (SELECT system_identifier FROM pg_control_system()) END, 0),
           (SELECT oid FROM pg_database WHERE datname = current_database())::bigint,
           pg_relation_filenode('journal_mark')::bigint,
           journal_timeline()
$$;
