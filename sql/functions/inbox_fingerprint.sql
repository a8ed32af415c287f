-- inbox_fingerprint returns the stored fingerprint of p_event_id, or NULL
-- when the inbox does not hold it: looked up in every slot of the ring (a
-- unique index cannot span partitions, so each slot's primary key is
-- probed) and, while the table of the layout before the ring exists, in
-- processed_event_legacy too (sql/0011). A claim calls it only while it
-- holds the event id's advisory lock, so what it reads is every claim of
-- that id that committed before (adr/0009).

CREATE OR REPLACE FUNCTION inbox_fingerprint(p_event_id UUID) RETURNS BYTEA
LANGUAGE plpgsql AS $$
DECLARE
    stored BYTEA;
BEGIN
    SELECT fingerprint INTO stored FROM processed_event WHERE event_id = p_event_id LIMIT 1;
    IF NOT FOUND AND to_regclass('processed_event_legacy') IS NOT NULL THEN
        SELECT fingerprint INTO stored FROM processed_event_legacy WHERE event_id = p_event_id;
    END IF;
    RETURN stored;
END $$;
