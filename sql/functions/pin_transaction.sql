-- pin_transaction makes the calling transaction independent of the
-- database's defaults (adr/0002): it raises synchronous_commit to on for
-- this transaction alone when a database or role default says off, local
-- or remote_write (a stricter remote_apply is kept), so that the commit
-- that follows is durable, on the standby too where synchronous
-- replication is configured; and it refuses (TC002) any isolation but READ
-- COMMITTED, which db.inTx begins: apply_effect's advisory lock, then a
-- read of the transfer's row, is only safe when each statement takes a
-- fresh snapshot.

CREATE OR REPLACE FUNCTION pin_transaction() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'apply_event needs READ COMMITTED, the transaction is %', current_setting('transaction_isolation')
            USING ERRCODE = 'TC002';
    END IF;
END $$;
