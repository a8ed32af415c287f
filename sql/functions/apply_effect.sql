-- apply_effect is everything an event does after its inbox claim
-- succeeded, for one event alone (apply_event) or within a batch
-- (apply_batch). Its steps, in the design's order (adr/0001, adr/0004):
--   1. the transfer's advisory lock (key 7301003), then its row, then both
--      balances in account order (move_balances), then a transition that
--      was waiting for the creation;
--   2. a transition that contradicts its transfer raises SQLSTATE TC001,
--      which aborts the transaction, the claim included;
--   3. a transition that arrives before its transfer's creation waits in
--      pending_transition, with its original message (routing key, body,
--      headers, message id, content type; NULL for a creation, which never
--      waits), at most one per transfer;
--   4. a waiting transition that turns out to contradict the creation ends
--      like one that arrives after it: not applied, no trace left in the
--      inbox (so that a replay is judged again), and dead-lettered as
--      invalid-transition with its original message, through
--      dead_letter_outbox, which the service publishes after the commit and
--      deletes once the broker confirmed, so a crash in between loses
--      nothing;
--   5. a TransferCreated whose inbox row retention pruned (adr/0003) comes
--      back as 'duplicate': the transfer row, created by this very event
--      with the same data, proves it was applied. A completion or failure
--      whose transfer is already in the state it leads to changes nothing.
-- It returns 'applied', 'duplicate', or 'applied+outbox' when the
-- transaction left a dead letter in dead_letter_outbox.

CREATE OR REPLACE FUNCTION apply_effect(
    p_event_id UUID, p_event_type TEXT, p_transfer_id UUID,
    p_from TEXT, p_to TEXT, p_amount BIGINT, p_currency TEXT,
    p_routing_key TEXT, p_body BYTEA, p_headers JSONB, p_message_id TEXT, p_content_type TEXT) RETURNS TEXT
LANGUAGE plpgsql AS $$
DECLARE
    cur     transfer%ROWTYPE;
    pend    pending_transition%ROWTYPE;
    waiting TEXT;
    target  TEXT;
BEGIN
    PERFORM pg_advisory_xact_lock(7301003, hashtext(p_transfer_id::text));

    IF p_event_type = 'TransferCreated' THEN
        INSERT INTO transfer (transfer_id, from_account, to_account, amount_minor, currency, state, created_event_id)
        VALUES (p_transfer_id, p_from, p_to, p_amount, p_currency, 'created', p_event_id)
        ON CONFLICT (transfer_id) DO NOTHING;
        IF NOT FOUND THEN
            SELECT * INTO cur FROM transfer WHERE transfer_id = p_transfer_id;
            IF cur.created_event_id = p_event_id AND (cur.from_account, cur.to_account, cur.amount_minor, cur.currency)
                    IS NOT DISTINCT FROM (p_from, p_to, p_amount, p_currency) THEN
                RETURN 'duplicate'; -- this very event, applied before its inbox row was pruned
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'TC001',
                MESSAGE = format('transfer %s was already created by event %s', p_transfer_id, cur.created_event_id);
        END IF;
        PERFORM move_balances(p_from, p_to, p_amount);
        DELETE FROM pending_transition WHERE transfer_id = p_transfer_id RETURNING * INTO pend;
        IF NOT FOUND THEN
            RETURN 'applied';
        END IF;
        IF (pend.from_account, pend.to_account, pend.amount_minor, pend.currency)
                IS NOT DISTINCT FROM (p_from, p_to, p_amount, p_currency) THEN
            PERFORM set_transfer_state(p_transfer_id, pend.event_type);
            RETURN 'applied';
        END IF;
        -- The waiting transition contradicts the transfer: it is not
        -- applied and leaves the inbox, as if it had come after.
        DELETE FROM processed_event WHERE event_id = pend.event_id;
        IF to_regclass('processed_event_legacy') IS NOT NULL THEN
            DELETE FROM processed_event_legacy WHERE event_id = pend.event_id;
        END IF;
        INSERT INTO dead_letter_outbox (event_id, event_type, class, reason, routing_key, body, headers, message_id, content_type)
        VALUES (pend.event_id, pend.event_type, 'invalid-transition',
            format('%s for transfer %s carries %s→%s %s %s, the transfer is %s→%s %s %s', pend.event_type, p_transfer_id,
                pend.from_account, pend.to_account, pend.amount_minor, pend.currency, p_from, p_to, p_amount, p_currency),
            coalesce(pend.routing_key, pend.from_account),
            coalesce(pend.body, convert_to(json_build_object(
                'eventId', pend.event_id, 'eventType', pend.event_type, 'occurredAt', pend.received_at,
                'data', json_build_object('transferId', p_transfer_id, 'fromAccount', pend.from_account,
                    'toAccount', pend.to_account, 'amountMinor', pend.amount_minor, 'currency', pend.currency))::text, 'UTF8')),
            pend.headers, coalesce(pend.message_id, pend.event_id::text), coalesce(pend.content_type, 'application/json'));
        RETURN 'applied+outbox';
    END IF;

    SELECT * INTO cur FROM transfer WHERE transfer_id = p_transfer_id;
    IF NOT FOUND THEN
        -- Before its creation: wait, at most one transition per transfer,
        -- with what a dead letter of it would need.
        INSERT INTO pending_transition (transfer_id, event_id, event_type, from_account, to_account, amount_minor, currency,
            routing_key, body, headers, message_id, content_type)
        VALUES (p_transfer_id, p_event_id, p_event_type, p_from, p_to, p_amount, p_currency,
            p_routing_key, p_body, p_headers, p_message_id, p_content_type)
        ON CONFLICT (transfer_id) DO NOTHING;
        IF FOUND THEN
            RETURN 'applied';
        END IF;
        SELECT event_type INTO waiting FROM pending_transition WHERE transfer_id = p_transfer_id;
        IF waiting = p_event_type THEN
            RETURN 'applied'; -- the same transition is already waiting
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'TC001',
            MESSAGE = format('%s for transfer %s contradicts the %s waiting for its creation', p_event_type, p_transfer_id, waiting);
    END IF;

    IF (cur.from_account, cur.to_account, cur.amount_minor, cur.currency) IS DISTINCT FROM (p_from, p_to, p_amount, p_currency) THEN
        RAISE EXCEPTION USING ERRCODE = 'TC001',
            MESSAGE = format('%s for transfer %s carries %s→%s %s %s, the transfer is %s→%s %s %s', p_event_type, p_transfer_id,
                p_from, p_to, p_amount, p_currency, cur.from_account, cur.to_account, cur.amount_minor, cur.currency);
    END IF;
    target := CASE p_event_type WHEN 'TransferFailed' THEN 'failed' ELSE 'completed' END;
    IF cur.state = target THEN
        RETURN 'applied'; -- another event said the same thing
    END IF;
    IF cur.state <> 'created' THEN
        RAISE EXCEPTION USING ERRCODE = 'TC001',
            MESSAGE = format('%s for transfer %s, which is already %s', p_event_type, p_transfer_id, cur.state);
    END IF;
    PERFORM set_transfer_state(p_transfer_id, p_event_type);
    RETURN 'applied';
END $$;
