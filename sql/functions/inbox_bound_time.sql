-- inbox_bound_time is the time a partition bound (inbox_bound) stands for:
-- the id's first 48 bits, read as Unix milliseconds.

CREATE OR REPLACE FUNCTION inbox_bound_time(id UUID) RETURNS TIMESTAMPTZ
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT to_timestamp(('x' || left(replace(id::text, '-', ''), 12))::bit(48)::bigint / 1000.0)
$$;
