-- claim_taken answers for an event whose inbox claim found its row taken:
-- 'duplicate' when the stored fingerprint is the event's, else a producer
-- conflict, recorded once in producer_conflict (a redelivery of the same
-- conflicting message adds no row), and returned as
-- 'conflict:<stored fingerprint, hex>'. It looks in
-- processed_event_legacy too while that table is kept (sql/0012).

CREATE OR REPLACE FUNCTION claim_taken(p_event_id UUID, p_fingerprint BYTEA) RETURNS TEXT
LANGUAGE plpgsql AS $$
DECLARE
    stored BYTEA;
BEGIN
    -- Claimed, and committed (ON CONFLICT waited for the owner), or by this
    -- very transaction, earlier in its batch.
    SELECT fingerprint INTO stored FROM processed_event WHERE event_id = p_event_id;
    IF NOT FOUND AND to_regclass('processed_event_legacy') IS NOT NULL THEN
        SELECT fingerprint INTO stored FROM processed_event_legacy WHERE event_id = p_event_id;
    END IF;
    IF NOT FOUND OR stored = p_fingerprint THEN
        -- (Not found: retention removed the row in between; it existed,
        -- so the event was applied.)
        RETURN 'duplicate';
    END IF;
    INSERT INTO producer_conflict (event_id, stored_fingerprint, received_fingerprint)
    VALUES (p_event_id, stored, p_fingerprint)
    ON CONFLICT (event_id, stored_fingerprint, received_fingerprint) DO NOTHING;
    RETURN 'conflict:' || encode(stored, 'hex');
END $$;
