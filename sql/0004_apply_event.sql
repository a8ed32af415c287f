-- apply_event applies one event: the whole of db.Inbox.Apply's transaction
-- body, in one statement, so that an event costs three round trips (BEGIN,
-- this, COMMIT) instead of one or two per step. The order of the steps is
-- the design's (adr/0001, adr/0004):
--   1. the insert-first claim of event_id in the inbox: exactly one
--      transaction can insert it, whatever the timing;
--   2. a duplicate returns 'duplicate'; the same event_id with another
--      fingerprint is recorded in producer_conflict and returns 'conflict';
--   3. the transfer's advisory lock, then its row, then both balances in
--      account order (balance_minor = balance_minor + delta), then a
--      transition that was waiting for the creation;
--   4. a transition that contradicts its transfer raises SQLSTATE TC001,
--      which aborts the transaction, the claim included.
-- It returns 'applied', 'duplicate' or 'conflict:<stored fingerprint, hex>'.

CREATE FUNCTION move_balances(p_from TEXT, p_to TEXT, p_amount BIGINT) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO balance_projection AS b (account, balance_minor)
    SELECT account, delta FROM (VALUES (p_from, -p_amount), (p_to, p_amount)) AS v(account, delta)
    ORDER BY account
    ON CONFLICT (account) DO UPDATE
    SET balance_minor = b.balance_minor + EXCLUDED.balance_minor,
        updated_at = now();
$$;

-- set_transfer_state moves a created transfer to the state event_type leads
-- to, at most once; a failure gives the amount back.
CREATE FUNCTION set_transfer_state(p_transfer_id UUID, p_event_type TEXT) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t transfer%ROWTYPE;
BEGIN
    UPDATE transfer
    SET state = CASE p_event_type WHEN 'TransferFailed' THEN 'failed' ELSE 'completed' END,
        updated_at = now()
    WHERE transfer_id = p_transfer_id AND state = 'created'
    RETURNING * INTO t;
    IF FOUND AND t.state = 'failed' THEN
        PERFORM move_balances(t.to_account, t.from_account, t.amount_minor);
    END IF;
END $$;

CREATE FUNCTION apply_event(
    p_event_id UUID, p_event_type TEXT, p_fingerprint BYTEA, p_transfer_id UUID,
    p_from TEXT, p_to TEXT, p_amount BIGINT, p_currency TEXT) RETURNS TEXT
LANGUAGE plpgsql AS $$
DECLARE
    stored  BYTEA;
    cur     transfer%ROWTYPE;
    waiting TEXT;
    target  TEXT;
BEGIN
    INSERT INTO processed_event (event_id, event_type, fingerprint)
    VALUES (p_event_id, p_event_type, p_fingerprint)
    ON CONFLICT (event_id) DO NOTHING;
    IF NOT FOUND THEN
        -- Already claimed, and committed: ON CONFLICT waited for the owner.
        SELECT fingerprint INTO stored FROM processed_event WHERE event_id = p_event_id;
        IF stored = p_fingerprint THEN
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
            RAISE EXCEPTION USING ERRCODE = 'TC001',
                MESSAGE = format('transfer %s was already created by another event', p_transfer_id);
        END IF;
        PERFORM move_balances(p_from, p_to, p_amount);
        -- The waiting event was acked long ago; it is applied with the
        -- amounts of the transfer, which are authoritative.
        DELETE FROM pending_transition WHERE transfer_id = p_transfer_id RETURNING event_type INTO waiting;
        IF FOUND THEN
            PERFORM set_transfer_state(p_transfer_id, waiting);
        END IF;
        RETURN 'applied';
    END IF;

    SELECT * INTO cur FROM transfer WHERE transfer_id = p_transfer_id;
    IF NOT FOUND THEN
        -- Before its creation: wait, at most one transition per transfer.
        INSERT INTO pending_transition (transfer_id, event_id, event_type, from_account, to_account, amount_minor, currency)
        VALUES (p_transfer_id, p_event_id, p_event_type, p_from, p_to, p_amount, p_currency)
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
