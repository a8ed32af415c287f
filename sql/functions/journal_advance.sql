-- journal_advance moves p_queue's journal mark from p_prev to p_last, in
-- the transaction of the events that take the sequences p_prev+1 …
-- p_last (adr/0014). When the database does not hold p_prev, it raises
-- TCJ01 and the transaction applies nothing: the database lost commits the
-- service made (a failover to a standby that was behind, a restore), or
-- another consumer of the queue moved the mark since; the service then
-- reads the journal again before it goes on. A second transaction on the
-- same queue waits for the first's row lock, then finds the mark moved.

CREATE OR REPLACE FUNCTION journal_advance(p_queue TEXT, p_prev BIGINT, p_last BIGINT) RETURNS VOID
LANGUAGE plpgsql AS $$
DECLARE
    held BIGINT;
BEGIN
    UPDATE journal_mark SET seq = p_last, at = now() WHERE queue = p_queue AND seq = p_prev;
    IF FOUND THEN
        RETURN;
    END IF;
    IF p_prev = 0 THEN
        INSERT INTO journal_mark (queue, seq) VALUES (p_queue, p_last) ON CONFLICT (queue) DO NOTHING;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    SELECT seq INTO held FROM journal_mark WHERE queue = p_queue;
    RAISE EXCEPTION 'journal gap on %: the database holds entry %, the service went on from %',
        p_queue, coalesce(held, 0), p_prev
        USING ERRCODE = 'TCJ01';
END $$;
