-- journal_advance moves p_queue's journal mark from p_prev to p_last, in
-- the transaction of the events that take the sequences p_prev+1 …
-- p_last (adr/0014). When the database does not hold p_prev, it raises
-- TCJ01 and the transaction applies nothing: the database lost commits the
-- service made (a failover to a standby that was behind, a restore), or
-- another consumer of the queue moved the mark since; the service then
-- reads the journal again before it goes on. A second transaction on the
-- same queue waits for the first's row lock, then finds the mark moved.
--
-- The mark's time (at), where a read of the journal starts, becomes the
-- commit's: the entries above p_last are written after it. With
-- p_restore (a restore applying entries the journal already holds, a loss
-- accepted) it stays: the entries above p_last were written before, and a
-- restore cut short must still reach them from the moved mark. A queue's
-- first row made by a restore takes the epoch, the read then starting at
-- the stream's first entry, as it did with no row.
--
-- Unless p_restore, the mark moves only while a read of the journal has
-- vouched for it in this database as it is now (journal_vouched_here):
-- after a failover or a restore, the mark a lane went on from may be one
-- the database came back to, having lost what another consumer of the
-- queue applied after it (a handover), so the transaction raises TCJ01
-- and the lane reads the journal first, which vouches for the mark anew.

CREATE OR REPLACE FUNCTION journal_advance(p_queue TEXT, p_prev BIGINT, p_last BIGINT, p_restore BOOLEAN DEFAULT false) RETURNS VOID
LANGUAGE plpgsql AS $$
DECLARE
    held BIGINT;
BEGIN
    UPDATE journal_mark m SET seq = p_last, at = CASE WHEN p_restore THEN m.at ELSE now() END
        WHERE m.queue = p_queue AND m.seq = p_prev AND (p_restore OR journal_vouched_here(m));
    IF FOUND THEN
        RETURN;
    END IF;
    IF p_prev = 0 THEN
        INSERT INTO journal_mark (queue, seq, at) VALUES (p_queue, p_last, CASE WHEN p_restore THEN to_timestamp(0) ELSE now() END)
            ON CONFLICT (queue) DO NOTHING;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    SELECT seq INTO held FROM journal_mark WHERE queue = p_queue;
    IF held = p_prev THEN
        RAISE EXCEPTION 'journal gap on %: the database holds entry %, but no read of the journal has vouched for it in this '
            'database as it is now (a failover or a restore since, or never read), so it may lack what another consumer '
            'of the queue applied after it', p_queue, held
            USING ERRCODE = 'TCJ01';
    END IF;
    RAISE EXCEPTION 'journal gap on %: the database holds entry %, the service went on from %',
        p_queue, coalesce(held, 0), p_prev
        USING ERRCODE = 'TCJ01';
END $$;
