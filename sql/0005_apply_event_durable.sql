-- apply_event as in 0004, made independent of the database's defaults
-- (adr/0002): it raises synchronous_commit to on for its own transaction
-- when a database or role default says off, local or remote_write, and it
-- refuses to run at any isolation but READ COMMITTED. CREATE OR REPLACE, so
-- that running this file again (after the function was dropped by mistake)
-- brings it back as it was.

CREATE OR REPLACE FUNCTION apply_event(
    p_event_id UUID, p_event_type TEXT, p_fingerprint BYTEA, p_transfer_id UUID,
    p_from TEXT, p_to TEXT, p_amount BIGINT, p_currency TEXT) RETURNS TEXT
LANGUAGE plpgsql AS $$
DECLARE
    stored  BYTEA;
    cur     transfer%ROWTYPE;
    waiting TEXT;
    target  TEXT;
BEGIN
    -- The commit that follows this call must be durable (on the standby too,
    -- where synchronous replication is configured), whatever a database or
    -- role default says: a weaker setting is raised for this transaction
    -- alone; a stricter one (remote_apply) is kept.
    IF current_setting('synchronous_commit') NOT IN ('on', 'remote_apply') THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    -- The advisory lock below, then a read of the transfer's row, is only
    -- safe when each statement takes a fresh snapshot. db.inTx begins READ
    -- COMMITTED; this refuses anything else rather than apply wrongly.
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
