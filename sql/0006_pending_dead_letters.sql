-- A transition that waited for its creation and turns out to contradict it
-- ends like one that arrives after the creation: not applied, dead-lettered
-- as invalid-transition with its original body, routing key and headers,
-- and no trace in the inbox (so that a replay is judged again). The waiting
-- row keeps what the dead letter needs; the creation's transaction moves it
-- to dead_letter_outbox, which the service publishes after the commit and
-- deletes once the broker confirmed: a crash in between loses nothing.
--
-- A TransferCreated whose inbox row retention pruned long ago (adr/0003)
-- comes back as 'duplicate': the transfer row, created by this very event,
-- proves it was applied.
--
-- Written to run again harmlessly (after a function was dropped by mistake).

ALTER TABLE pending_transition
    ADD COLUMN IF NOT EXISTS routing_key  TEXT,
    ADD COLUMN IF NOT EXISTS body         BYTEA,
    ADD COLUMN IF NOT EXISTS headers      JSONB,
    ADD COLUMN IF NOT EXISTS message_id   TEXT,
    ADD COLUMN IF NOT EXISTS content_type TEXT;

CREATE TABLE IF NOT EXISTS dead_letter_outbox (
    id           BIGSERIAL   PRIMARY KEY,
    event_id     UUID        NOT NULL,
    event_type   TEXT        NOT NULL,
    class        TEXT        NOT NULL,
    reason       TEXT        NOT NULL,
    routing_key  TEXT        NOT NULL,
    body         BYTEA       NOT NULL,
    headers      JSONB,
    message_id   TEXT,
    content_type TEXT,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);

DROP FUNCTION IF EXISTS apply_event(UUID, TEXT, BYTEA, UUID, TEXT, TEXT, BIGINT, TEXT);

-- apply_event as in 0005, with the original message of a transition (NULL
-- for a creation, which never waits): it returns 'applied', 'duplicate',
-- 'conflict:<stored fingerprint, hex>', or 'applied+outbox' when the
-- transaction left a dead letter in dead_letter_outbox.
CREATE OR REPLACE FUNCTION apply_event(
    p_event_id UUID, p_event_type TEXT, p_fingerprint BYTEA, p_transfer_id UUID,
    p_from TEXT, p_to TEXT, p_amount BIGINT, p_currency TEXT,
    p_routing_key TEXT, p_body BYTEA, p_headers JSONB, p_message_id TEXT, p_content_type TEXT) RETURNS TEXT
LANGUAGE plpgsql AS $$
DECLARE
    stored  BYTEA;
    cur     transfer%ROWTYPE;
    pend    pending_transition%ROWTYPE;
    waiting TEXT;
    target  TEXT;
BEGIN
    -- Durability and isolation whatever the defaults say (0005, adr/0002).
    IF current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'apply_event needs READ COMMITTED, the transaction is %', current_setting('transaction_isolation')
            USING ERRCODE = 'TC002';
    END IF;

    INSERT INTO processed_event (event_id, event_type, fingerprint)
    VALUES (p_event_id, p_event_type, p_fingerprint)
    ON CONFLICT (event_id) DO NOTHING;
    IF NOT FOUND THEN
        -- Already claimed, and committed: ON CONFLICT waited for the owner.
        SELECT fingerprint INTO stored FROM processed_event WHERE event_id = p_event_id;
        IF NOT FOUND OR stored = p_fingerprint THEN
            -- (Not found: retention removed the row in between; it existed,
            -- so the event was applied.)
            RETURN 'duplicate';
        END IF;
        INSERT INTO producer_conflict (event_id, stored_fingerprint, received_fingerprint)
        VALUES (p_event_id, stored, p_fingerprint);
        RETURN 'conflict:' || encode(stored, 'hex');
    END IF;

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
