-- inbox_maintain keeps the inbox's partitions (sql/0012, adr/0011) and
-- returns what it did, a line each. The schema's owner runs it: `migrate`
-- does after migrating, a CronJob daily, and the service every
-- PRUNE_INTERVAL when its role may (a role with no DDL is refused, 42501,
-- and only deletes rows, db.Prune). It
--
--   1. makes the partitions of the next p_ahead UTC days, each carved off
--      the lower end of the year partition that holds it: the few rows
--      already there (ids of other versions, clocks ahead) move with it.
--      A day whose year partition begins before it cannot be carved:
--      claims already go there (nobody ran this for p_ahead days); it
--      says so, and that year partition is dropped whole in its turn;
--   2. drops each day or year partition whose every id was minted more
--      than p_ttl ago: its rows claimed within p_ttl (events delivered
--      late, and ids of other versions) move to processed_event_default
--      first, which holds the dropped ranges;
--   3. drops processed_event_legacy once its newest claim is older than
--      p_ttl.
--
-- Each change runs with processed_event locked (ACCESS EXCLUSIVE, taken
-- once, at the first change): claims wait the few milliseconds it takes,
-- and never meet a range without its partition or a row on its way. Two
-- runs take turns on an advisory lock. A lock it waits for over 5 s fails
-- the run (55P03), to be tried again. p_ttl must be INBOX_TTL, or more.

CREATE OR REPLACE FUNCTION inbox_maintain(p_ttl INTERVAL, p_ahead INT DEFAULT 31) RETURNS TEXT[]
LANGUAGE plpgsql AS $$
DECLARE
    done   TEXT[] := '{}';
    today  DATE := (now() AT TIME ZONE 'UTC')::date;
    d      DATE;
    day    TEXT;
    c      RECORD;
    p      RECORD;
    moved  BIGINT;
BEGIN
    IF p_ttl IS NULL OR p_ttl < interval '1 hour' THEN
        RAISE EXCEPTION 'inbox_maintain: the TTL must be at least 1 hour, got %', p_ttl USING ERRCODE = '22023';
    END IF;
    IF (SELECT relkind FROM pg_class WHERE oid = to_regclass('processed_event')) IS DISTINCT FROM 'p' THEN
        RETURN done;
    END IF;
    -- Only the owner may change partitions: say so before taking any lock
    -- (the service's role may lock the table, and would then be refused).
    IF NOT pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = 'processed_event'::regclass), 'USAGE') THEN
        RAISE EXCEPTION 'inbox_maintain: role % does not own processed_event; its owner maintains the partitions', current_user
            USING ERRCODE = '42501';
    END IF;
    -- A long reader of the inbox must not hold every claim behind this
    -- lock request: give up after 5 s, and try again at the next run.
    PERFORM set_config('lock_timeout', '5s', true);
    PERFORM pg_advisory_xact_lock(7301004);

    FOR i IN 1 .. p_ahead LOOP
        d := today + i;
        day := 'processed_event_d' || to_char(d, 'YYYYMMDD');
        CONTINUE WHEN to_regclass(day) IS NOT NULL;
        SELECT * INTO c FROM inbox_partitions() ip
        WHERE ip.lower_bound <= inbox_day_bound(d)
          AND (ip.upper_bound IS NULL OR ip.upper_bound > inbox_day_bound(d));
        IF NOT FOUND OR c.name !~ '^processed_event_y[0-9]{4}$' OR c.lower_bound <> inbox_day_bound(d) THEN
            done := done || format('cannot make %s: its ids go to %s already, which is dropped whole once its last day is past the TTL',
                day, coalesce(c.name, 'no partition'));
            EXIT;
        END IF;
        PERFORM inbox_detach(c.part);
        EXECUTE format('CREATE TABLE %I PARTITION OF processed_event FOR VALUES FROM (%L) TO (%L)',
            day, inbox_day_bound(d), inbox_day_bound(d + 1));
        EXECUTE format('WITH m AS (DELETE FROM %s WHERE event_id < %L RETURNING *) INSERT INTO processed_event SELECT * FROM m',
            c.part, inbox_day_bound(d + 1));
        IF c.upper_bound > inbox_day_bound(d + 1) THEN
            EXECUTE format('ALTER TABLE processed_event ATTACH PARTITION %s FOR VALUES FROM (%L) TO (%L)',
                c.part, inbox_day_bound(d + 1), c.upper_bound);
        ELSE
            EXECUTE format('DROP TABLE %s', c.part);
        END IF;
        done := done || format('made %s', day);
    END LOOP;

    FOR p IN SELECT * FROM inbox_partitions() ip
        WHERE ip.name ~ '^processed_event_(d[0-9]{8}|y[0-9]{4})$'
          AND inbox_bound_time(ip.upper_bound) <= now() - p_ttl
    LOOP
        PERFORM inbox_detach(p.part);
        EXECUTE format('INSERT INTO processed_event SELECT * FROM %s WHERE processed_at >= now() - %L::interval',
            p.part, p_ttl);
        GET DIAGNOSTICS moved = ROW_COUNT;
        EXECUTE format('DROP TABLE %s', p.part);
        done := done || format('dropped %s; %s of its rows, claimed within the TTL, moved to processed_event_default',
            p.name, moved);
    END LOOP;

    IF to_regclass('processed_event_legacy') IS NOT NULL THEN
        IF NOT EXISTS (SELECT 1 FROM processed_event_legacy WHERE processed_at >= now() - p_ttl) THEN
            DROP TABLE processed_event_legacy;
            done := done || 'dropped processed_event_legacy: its newest claim is older than the TTL'::text;
        END IF;
    END IF;
    RETURN done;
END $$;
