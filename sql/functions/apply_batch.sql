-- apply_batch applies many events in one transaction (adr/0006) and
-- returns one outcome per event, in order, as apply_event does. It claims
-- every event of the batch in one statement, in delivery order (an id
-- twice in the batch is claimed by its first delivery), then applies the
-- effects in delivery order. A batch holds many locks at once, so it takes
-- the ones batches on other queues share, the transfers' advisory locks and
-- the balance rows, in one global order before any effect: by key, by
-- account. Two batches then never wait on each other in a cycle, whatever
-- accounts they share (a single event follows the same order). Two queues'
-- batches share an event id only when a producer published one event under
-- two keys, and a deadlock there is retried like any other. A transition
-- that contradicts its transfer (TC001) or values the database refuses
-- abort the whole batch: the service then splits it to find the event.
-- While processed_event_legacy is kept (sql/0012), the ids found there are
-- not claimed, and are answered by claim_taken.

CREATE OR REPLACE FUNCTION apply_batch(
    p_event_ids UUID[], p_event_types TEXT[], p_fingerprints BYTEA[], p_transfer_ids UUID[],
    p_froms TEXT[], p_tos TEXT[], p_amounts BIGINT[], p_currencies TEXT[],
    p_routing_keys TEXT[], p_bodies BYTEA[], p_headers JSONB[], p_message_ids TEXT[], p_content_types TEXT[]) RETURNS TEXT[]
LANGUAGE plpgsql AS $$
DECLARE
    claimed  UUID[];
    old      UUID[] := '{}';
    effected UUID[] := '{}';
    outcomes TEXT[] := '{}';
    k        INT;
    i        INT;
BEGIN
    PERFORM pin_transaction();
    IF to_regclass('processed_event_legacy') IS NOT NULL THEN
        SELECT coalesce(array_agg(event_id), '{}') INTO old
        FROM processed_event_legacy WHERE event_id = ANY (p_event_ids);
    END IF;
    -- Every claim in one statement, in delivery order; an id twice in the
    -- batch is claimed by its first delivery.
    WITH c AS (
        INSERT INTO processed_event (event_id, event_type, fingerprint)
        SELECT e, t, f FROM (
            SELECT e, t, f, n, row_number() OVER (PARTITION BY e ORDER BY n) AS r
            FROM unnest(p_event_ids, p_event_types, p_fingerprints) WITH ORDINALITY AS u(e, t, f, n)) x
        WHERE r = 1 AND NOT e = ANY (old) ORDER BY n
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
