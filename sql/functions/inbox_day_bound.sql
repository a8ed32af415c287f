-- Made before the numbered migrations, which may call it.
-- inbox_day_bound is inbox_bound at the start of UTC day d: the lower
-- bound of that day's inbox partition, and the upper bound of the day
-- before's.

CREATE OR REPLACE FUNCTION inbox_day_bound(d DATE) RETURNS UUID
LANGUAGE sql IMMUTABLE STRICT AS $$
    SELECT inbox_bound(d::timestamp AT TIME ZONE 'UTC')
$$;
