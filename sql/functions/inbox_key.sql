-- inbox_key is the advisory lock key of an event id: its first 64 bits.
-- Every claim takes pg_advisory_xact_lock(inbox_key(id)) before it looks
-- the id up (adr/0009). Two ids that share their first 64 bits only wait
-- for each other; no claim is ever judged by another id's row. The key is
-- a single bigint, a space apart from the transfers' two-int keys
-- (7301003, …).

CREATE OR REPLACE FUNCTION inbox_key(p_event_id UUID) RETURNS BIGINT
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ('x' || translate(left(p_event_id::text, 18), '-', ''))::bit(64)::bigint;
$$;
