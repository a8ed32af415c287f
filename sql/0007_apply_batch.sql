-- Batches (adr/0006): one transaction applies many events, so the body of
-- apply_event is split in three pieces that a single event and a batch
-- share:
--   pin_transaction  durability and isolation whatever the defaults (0005);
--   claim_taken      the answer for an event whose claim found its row
--                    taken: a duplicate, or a producer conflict (recorded);
--   apply_effect     everything after the claim (0006), unchanged.
-- apply_event is these three for one event; apply_batch claims every event
-- of a batch in one statement and applies the effects in delivery order.
-- A batch holds many locks at once, so it takes the ones batches on other
-- queues share, the transfers' advisory locks and the balance rows, in one
-- global order before any effect: by key, by account. Two batches then
-- never wait on each other in a cycle, whatever accounts they share (a
-- single event follows the same order). Claims are taken in delivery order:
-- two queues' batches share an event id only when a producer published one
-- event under two keys, and a deadlock there is retried like any other.

CREATE OR REPLACE FUNCTION pin_transaction() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'apply_event needs READ COMMITTED, the transaction is %', current_setting('transaction_isolation')
            USING ERRCODE = 'TC002';
    END IF;
END $$;

CREATE OR REPLACE FUNCTION claim_taken(p_event_id UUID, p_fingerprint BYTEA) RETURNS TEXT
LANGUAGE plpgsql AS $$
DECLARE
    stored BYTEA;
BEGIN
    -- Claimed, and committed (ON CONFLICT waited for the owner), or by this
    -- very transaction, earlier in its batch.
    SELECT fingerprint INTO stored FROM processed_event WHERE event_id = p_event_id;
    IF NOT FOUND OR stored = p_fingerprint THEN
        -- (Not found: retention removed the row in between; it existed,
        -- so the event was applied.)
        RETURN 'duplicate';
    END IF;
    INSERT INTO producer_conflict (event_id, stored_fingerprint, received_fingerprint)
    VALUES (p_event_id, stored, p_fingerprint);
    RETURN 'conflict:' || encode(stored, 'hex');
END $$;

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

CREATE OR REPLACE FUNCTION apply_event(
    p_event_id UUID, p_event_type TEXT, p_fingerprint BYTEA, p_transfer_id UUID,
    p_from TEXT, p_to TEXT, p_amount BIGINT, p_currency TEXT,
    p_routing_key TEXT, p_body BYTEA, p_headers JSONB, p_message_id TEXT, p_content_type TEXT) RETURNS TEXT
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pin_transaction();
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

-- apply_batch returns one outcome per event, in order, as apply_event does.
-- A transition that contradicts its transfer (TC001) or values the
-- database refuses abort the whole batch: the service then splits it to
-- find the event (adr/0006).
CREATE OR REPLACE FUNCTION apply_batch(
    p_event_ids UUID[], p_event_types TEXT[], p_fingerprints BYTEA[], p_transfer_ids UUID[],
    p_froms TEXT[], p_tos TEXT[], p_amounts BIGINT[], p_currencies TEXT[],
    p_routing_keys TEXT[], p_bodies BYTEA[], p_headers JSONB[], p_message_ids TEXT[], p_content_types TEXT[]) RETURNS TEXT[]
LANGUAGE plpgsql AS $$
DECLARE
    claimed  UUID[];
    effected UUID[] := '{}';
    outcomes TEXT[] := '{}';
    k        INT;
    i        INT;
BEGIN
    PERFORM pin_transaction();
    -- Every claim in one statement, in delivery order; an id twice in the
    -- batch is claimed by its first delivery.
    WITH c AS (
        INSERT INTO processed_event (event_id, event_type, fingerprint)
        SELECT e, t, f FROM (
            SELECT e, t, f, n, row_number() OVER (PARTITION BY e ORDER BY n) AS r
            FROM unnest(p_event_ids, p_event_types, p_fingerprints) WITH ORDINALITY AS u(e, t, f, n)) x
        WHERE r = 1 ORDER BY n
        ON CONFLICT (event_id) DO NOTHING
        RETURNING event_id)
    SELECT coalesce(array_agg(event_id), '{}') INTO claimed FROM c;
    -- The transfers' advisory locks, then the balance rows (made first
    -- where missing), each in one order.
    FOR k IN SELECT DISTINCT hashtext(t::text) FROM unnest(p_transfer_ids) t ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock(7301003, k);
    END LOOP;
    INSERT INTO balance_projection (account, balance_minor)
    SELECT DISTINCT a, 0 FROM unnest(p_event_ids, p_froms, p_tos) AS u(e, f, t), unnest(ARRAY[f, t]) a
    WHERE e = ANY (claimed) ORDER BY a
    ON CONFLICT (account) DO NOTHING;
    PERFORM 1 FROM balance_projection WHERE account = ANY (p_froms || p_tos) ORDER BY account FOR UPDATE;

    FOR i IN 1 .. coalesce(array_length(p_event_ids, 1), 0) LOOP
        IF p_event_ids[i] = ANY (claimed) AND NOT p_event_ids[i] = ANY (effected) THEN
            effected := effected || p_event_ids[i];
            outcomes := outcomes || apply_effect(p_event_ids[i], p_event_types[i], p_transfer_ids[i],
                p_froms[i], p_tos[i], p_amounts[i], p_currencies[i],
                p_routing_keys[i], p_bodies[i], p_headers[i], p_message_ids[i], p_content_types[i]);
        ELSE
            outcomes := outcomes || claim_taken(p_event_ids[i], p_fingerprints[i]);
        END IF;
    END LOOP;
    RETURN outcomes;
END $$;
