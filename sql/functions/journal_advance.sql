-- journal_advance moves p_queue's journal mark from p_prev to p_last, in
-- the transaction of the events that take the sequences p_prev+1 …
-- p_last (adr/0014). When the database does not hold p_prev, it raises
-- TCJ01 and the transaction applies nothing: the database lost commits the
-- service made (a failover to a standby that was behind, a restore), or
-- another consumer of the queue moved the mark since; the service then
-- reads the journal again before it goes on. A second transaction on the
-- same queue waits for the first's row lock, then finds the mark moved.
--
-- Unless p_restore, the mark moves only while it is trusted
-- (journal_mark_doubt: a read of the journal synced it, or a move from a
-- trusted mark, in this run of the server, by the transaction its row
-- names), and the move keeps it trusted: after a restart, a failover or a
-- restore, the mark a lane went on from may be one the database came back
-- to, having lost what another consumer of the queue applied after it (a
-- handover), so the transaction raises TCJ01 and the lane reads the
-- journal first, which trusts the mark anew. A queue without a row is a
-- queue whose row a restore took back, or one no read has synced: it too
-- raises TCJ01 (the read makes the row). The commit that trusts the mark
-- must be durable, so synchronous_commit is raised to on as
-- pin_transaction does, even when the transaction applies no event.
--
-- The mark's time (at), where a read of the journal starts, becomes the
-- commit's: the entries above p_last are written after it. With
-- p_restore (a restore applying entries the journal already holds, a loss
-- accepted) it stays: the entries above p_last were written before, and a
-- restore cut short must still reach them from the moved mark. A restore's
-- move leaves the mark untrusted until the read that made it ends and
-- syncs it (Vouch): a restore cut short must be read again, not trusted
-- from where it stopped. A queue's first row made by a restore takes the
-- epoch, the read then starting at the stream's first entry, as it did
-- with no row.

CREATE OR REPLACE FUNCTION journal_advance(p_queue TEXT, p_prev BIGINT, p_last BIGINT, p_restore BOOLEAN DEFAULT false) RETURNS VOID
LANGUAGE plpgsql AS $$
DECLARE
    held  BIGINT;
    doubt TEXT;
BEGIN
    IF p_restore THEN
        UPDATE journal_mark m SET seq = p_last, vouched_by = NULL, vouched_run = NULL
            WHERE m.queue = p_queue AND m.seq = p_prev;
        IF FOUND THEN
            RETURN;
        END IF;
        IF p_prev = 0 THEN
            INSERT INTO journal_mark (queue, seq, at) VALUES (p_queue, p_last, to_timestamp(0))
                ON CONFLICT (queue) DO NOTHING;
            IF FOUND THEN
                RETURN;
            END IF;
        END IF;
    ELSE
        IF current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
            PERFORM set_config('synchronous_commit', 'on', true);
        END IF;
        UPDATE journal_mark m SET seq = p_last, at = now(), vouched_by = pg_current_xact_id(),
                vouched_run = pg_postmaster_start_time()
            WHERE m.queue = p_queue AND m.seq = p_prev
              AND journal_mark_doubt(m.xmin, m.vouched_by, m.vouched_run) IS NULL;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    SELECT m.seq, journal_mark_doubt(m.xmin, m.vouched_by, m.vouched_run) INTO held, doubt
        FROM journal_mark m WHERE m.queue = p_queue;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'journal gap on %: the database holds no mark of the queue, the service went on from % '
            '(a restore to before the queue was first marked, or no read of the journal has synced it)', p_queue, p_prev
            USING ERRCODE = 'TCJ01';
    END IF;
    IF held = p_prev THEN
        RAISE EXCEPTION 'journal gap on %: the database holds entry %, but does not vouch that it lost no commit of the '
            'queue since a read of the journal last synced it (%), so it may lack what another consumer of the queue '
            'applied after it', p_queue, held, doubt
            USING ERRCODE = 'TCJ01';
    END IF;
    RAISE EXCEPTION 'journal gap on %: the database holds entry %, the service went on from %', p_queue, held, p_prev
        USING ERRCODE = 'TCJ01';
END $$;
