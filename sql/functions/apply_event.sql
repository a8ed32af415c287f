-- apply_event applies one event: the whole of db.Inbox.Apply's transaction
-- in one statement, which the service sends alone, so that PostgreSQL runs
-- it as one implicit transaction and an event costs one round trip
-- (adr/0005). It pins the transaction's durability and isolation
-- (pin_transaction), then claims event_id in the inbox insert-first:
-- exactly one transaction can insert it, whatever the timing (adr/0001). A
-- claim that finds the row taken is answered by claim_taken ('duplicate' or
-- 'conflict:<stored fingerprint, hex>'); one that succeeds goes on to
-- apply_effect ('applied', 'duplicate' or 'applied+outbox'). While the
-- inbox of before its partitions is kept (processed_event_legacy,
-- sql/0012), an id found there is answered by claim_taken first: nothing
-- is added to that table any more, so finding the id there cannot race.

CREATE OR REPLACE FUNCTION apply_event(
    p_event_id UUID, p_event_type TEXT, p_fingerprint BYTEA, p_transfer_id UUID,
    p_from TEXT, p_to TEXT, p_amount BIGINT, p_currency TEXT,
    p_routing_key TEXT, p_body BYTEA, p_headers JSONB, p_message_id TEXT, p_content_type TEXT) RETURNS TEXT
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pin_transaction();
    IF to_regclass('processed_event_legacy') IS NOT NULL THEN
        IF EXISTS (SELECT 1 FROM processed_event_legacy WHERE event_id = p_event_id) THEN
            RETURN claim_taken(p_event_id, p_fingerprint);
        END IF;
    END IF;
    -- The insert-first claim: exactly one transaction can insert event_id.
    INSERT INTO processed_event (event_id, event_type, fingerprint)
    VALUES (p_event_id, p_event_type, p_fingerprint)
    ON CONFLICT (event_id) DO NOTHING;
    IF NOT FOUND THEN
        RETURN claim_taken(p_event_id, p_fingerprint);
    END IF;
    RETURN apply_effect(p_event_id, p_event_type, p_transfer_id, p_from, p_to, p_amount, p_currency,
        p_routing_key, p_body, p_headers, p_message_id, p_content_type);
END $$;
