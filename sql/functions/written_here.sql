-- written_here says whether a row was written here by the transaction it
-- names: p_xmin is the row's xmin, p_by what that transaction stored of
-- itself (pg_current_xact_id(), an xid8, whose low 32 bits are the xid).
-- A row written by the service's own statement holds both alike; a row
-- copied in (pg_restore's COPY, logical replication's apply worker, a
-- data-only restore, a hand's INSERT of a saved row) was written by
-- another transaction than the one it names. PostgreSQL keeps a row's
-- raw xmin when it freezes it (9.4 and later), so the answer lasts. A
-- statement inside a savepoint writes with the subtransaction's xid:
-- such a row reads as copied, which errs on the side that reads again.
-- The journal's mark (journal_mark_doubt) and the reconciliation's
-- checkpoint both ask it.

CREATE OR REPLACE FUNCTION written_here(p_xmin xid, p_by xid8) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_xmin::text::bigint = p_by::text::bigint % 4294967296
$$;
