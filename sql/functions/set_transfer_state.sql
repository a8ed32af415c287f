-- set_transfer_state moves a created transfer to the state p_event_type
-- leads to (TransferFailed: failed, else completed), at most once; a
-- failure gives the amount back, and is written down in transfer_failure
-- with its transaction, for the periodic reconciliation (adr/0007).

CREATE OR REPLACE FUNCTION set_transfer_state(p_transfer_id UUID, p_event_type TEXT) RETURNS void
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
        INSERT INTO transfer_failure (transfer_id, from_account, to_account, amount_minor, created_xid)
        VALUES (t.transfer_id, t.from_account, t.to_account, t.amount_minor, t.created_xid);
    END IF;
END $$;
