-- claim_taken answers for an event whose inbox claim found its row taken:
-- 'duplicate' when the stored fingerprint is the event's, else a producer
-- conflict, recorded once in producer_conflict (a redelivery of the same
-- conflicting message adds no row), and returned as
-- 'conflict:<stored fingerprint, hex>'.

CREATE OR REPLACE FUNCTION claim_taken(p_event_id UUID, p_fingerprint BYTEA) RETURNS TEXT
LANGUAGE plpgsql AS $$
DECLARE
    stored BYTEA;
BEGIN
    -- Claimed, and committed (the claim waited for the owner at its
    -- advisory lock), or by this very transaction, earlier in its batch.
    stored := inbox_fingerprint(p_event_id);
    IF stored IS NULL OR stored = p_fingerprint THEN
        -- (Not found: retention removed the row in between; it existed,
        -- so the event was applied.)
        RETURN 'duplicate';
    END IF;
    INSERT INTO producer_conflict (event_id, stored_fingerprint, received_fingerprint)
    VALUES (p_event_id, stored, p_fingerprint)
    ON CONFLICT (event_id, stored_fingerprint, received_fingerprint) DO NOTHING;
    RETURN 'conflict:' || encode(stored, 'hex');
END $$;
