-- Made before the numbered migrations, which may call it.
-- inbox_bound is the smallest version-7 event id minted at time t: its
-- first 48 bits are t in Unix milliseconds, the rest zero. Every id
-- minted at t or later sorts at or after it, every id minted before sorts
-- before it, so one UTC day's ids are the keys from inbox_bound(day) to
-- inbox_bound(day + 1): the inbox's partitions are bounded by it (sql/0012,
-- inbox_maintain).

CREATE OR REPLACE FUNCTION inbox_bound(t TIMESTAMPTZ) RETURNS UUID
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT (lpad(to_hex(floor(extract(epoch FROM t) * 1000)::bigint), 12, '0') || repeat('0', 20))::uuid
$$;
