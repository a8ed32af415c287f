-- move_balances moves p_amount from p_from to p_to in balance_projection,
-- making either row if missing. Balances only ever change by
-- balance_minor = balance_minor + delta, so the order of events does not
-- matter to them. Both rows are written in account order.

CREATE OR REPLACE FUNCTION move_balances(p_from TEXT, p_to TEXT, p_amount BIGINT) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO balance_projection AS b (account, balance_minor)
    SELECT account, delta FROM (VALUES (p_from, -p_amount), (p_to, p_amount)) AS v(account, delta)
    ORDER BY account
    ON CONFLICT (account) DO UPDATE
    SET balance_minor = b.balance_minor + EXCLUDED.balance_minor,
        updated_at = now();
$$;
