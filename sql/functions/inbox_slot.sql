-- inbox_slot is the slot of the inbox ring (sql/0011, adr/0009) that a
-- claim made at p_at goes to: the number of whole slot widths since the
-- epoch, modulo the ring's size. A claim passes its transaction's now(),
-- the same time it stores in processed_at, so the slot and the row's age
-- always agree.

CREATE OR REPLACE FUNCTION inbox_slot(p_at TIMESTAMPTZ) RETURNS SMALLINT
LANGUAGE sql STABLE AS $$
    SELECT (floor(extract(epoch FROM p_at) / r.width_seconds)::bigint % r.slots)::smallint FROM inbox_ring r;
$$;
