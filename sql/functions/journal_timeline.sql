-- journal_timeline is the server's timeline, as the name of its current
-- WAL file begins with it: NULL on a standby, or for a role that may not
-- read it. A failover or a point-in-time restore starts a new one. A
-- single expression, so that SQL that calls it has it inlined. Only
-- journal_here calls it, for a release before sql/0018.

CREATE OR REPLACE FUNCTION journal_timeline() RETURNS BIGINT
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN NOT pg_is_in_recovery()
                    AND has_function_privilege('pg_walfile_name(pg_lsn)', 'execute')
                    AND has_function_privilege('pg_current_wal_lsn()', 'execute')
               THEN ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint END
$$;
