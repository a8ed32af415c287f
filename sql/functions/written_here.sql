-- Made before the numbered migrations, which may call it.
-- written_here says whether a row was written in this cluster, not copied
-- into it: p_xmin is the row's xmin (the transaction that wrote this
-- version of it), p_by the id a trigger stored in the row when that
-- transaction wrote it (pg_current_xact_id(), whose low 32 bits are an
-- xmin's). A copy writes the stored id as data: pg_restore's COPY and
-- INSERT fire no UPDATE trigger, and logical replication's apply worker
-- runs with session_replication_role = replica, which fires no ordinary
-- trigger; its row's xmin is then the copying transaction, not the one
-- stored. PostgreSQL keeps xmin as it is when VACUUM freezes the row (it
-- only marks it frozen), and pg_upgrade keeps both, with the cluster's
-- ids. An update made in a subtransaction stores the top transaction's
-- id while xmin is the subtransaction's: such a row looks copied, the
-- safe side. NULL p_by is not written here.
--
-- Neither privilege nor the transaction status log is needed: it reads
-- only the row. A single expression, so that a query that calls it has it
-- inlined. The reconciliation's checkpoint (adr/0007) and the journal's
-- mark (journal_mark_doubt, adr/0014) call it: the one definition of the
-- test for any row that must tell.

CREATE OR REPLACE FUNCTION written_here(p_xmin xid, p_by xid8) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(p_xmin = p_by::xid, false)
$$;
