-- journal_vouched_here says whether the queue's mark row m is trusted
-- without reading the journal (journal_mark_doubt, the one definition of
-- it). This release does not call it: a release before sql/0018 does,
-- during a rolling deploy (its watch), and its signature stays for it.
-- The row is read again for its xmin, which a row value does not carry.

CREATE OR REPLACE FUNCTION journal_vouched_here(m journal_mark) RETURNS BOOLEAN
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT journal_mark_doubt(j.xmin, j.vouched_by, j.vouched_run) IS NULL
                     FROM journal_mark j WHERE j.queue = m.queue), false)
$$;
