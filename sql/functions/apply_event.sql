-- apply_event applies one event: the whole of db.Inbox.Apply's transaction
-- body in one statement, so that an event costs one call between BEGIN and
-- COMMIT. It pins the transaction's durability and isolation
-- (pin_transaction), then claims event_id in the inbox (adr/0001,
-- adr/0009): it takes the id's advisory lock, looks the id up in every
-- live slot of the ring (and the legacy table while it exists), and only
-- if it is nowhere inserts it into the slot of the transaction's time. The
-- lock makes the lookup and the insert one critical section: a second
-- claim of the id waits at the lock until the first commits or rolls back,
-- and its lookup, a new statement in READ COMMITTED, then sees that
-- commit. The insert still goes through the slot's primary key, so two
-- claims of one id in one slot meet there even without the lock. A claim
-- that finds the id taken is answered by claim_taken ('duplicate' or
-- 'conflict:<stored fingerprint, hex>'); one that succeeds goes on to
-- apply_effect ('applied', 'duplicate' or 'applied+outbox').

CREATE OR REPLACE FUNCTION apply_event(
    p_event_id UUID, p_event_type TEXT, p_fingerprint BYTEA, p_transfer_id UUID,
    p_from TEXT, p_to TEXT, p_amount BIGINT, p_currency TEXT,
    p_routing_key TEXT, p_body BYTEA, p_headers JSONB, p_message_id TEXT, p_content_type TEXT) RETURNS TEXT
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pin_transaction();
    PERFORM pg_advisory_xact_lock(inbox_key(p_event_id));
    IF inbox_fingerprint(p_event_id) IS NOT NULL THEN
        RETURN claim_taken(p_event_id, p_fingerprint);
    END IF;
    INSERT INTO processed_event (event_id, event_type, fingerprint, slot)
    VALUES (p_event_id, p_event_type, p_fingerprint, inbox_slot(now()))
    ON CONFLICT (event_id, slot) DO NOTHING;
    IF NOT FOUND THEN
        RETURN claim_taken(p_event_id, p_fingerprint);
    END IF;
    RETURN apply_effect(p_event_id, p_event_type, p_transfer_id, p_from, p_to, p_amount, p_currency,
        p_routing_key, p_body, p_headers, p_message_id, p_content_type);
END $$;
