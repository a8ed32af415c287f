-- inbox_days_ahead counts the UTC days from tomorrow on that have their
-- own inbox partition, up to the first that has none: how long claims
-- keep landing in partitions that retention can drop whole if nobody
-- runs inbox_maintain from now on. NULL when the inbox is not
-- partitioned.

CREATE OR REPLACE FUNCTION inbox_days_ahead() RETURNS INT
LANGUAGE plpgsql STABLE AS $$
DECLARE
    d DATE := (now() AT TIME ZONE 'UTC')::date + 1;
    n INT := 0;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = to_regclass('processed_event')) IS DISTINCT FROM 'p' THEN
        RETURN NULL;
    END IF;
    WHILE to_regclass('processed_event_d' || to_char(d, 'YYYYMMDD')) IS NOT NULL LOOP
        n := n + 1;
        d := d + 1;
    END LOOP;
    RETURN n;
END $$;
