-- The inbox, partitioned by the event id's range (adr/0011). A version-7
-- id begins with its creation time in milliseconds, so one UTC day's ids
-- are one range of keys: each day of the window has its own partition,
-- which retention drops whole once the day is older than INBOX_TTL
-- (inbox_maintain) instead of deleting its rows one by one. The primary
-- key is still event_id alone (the partition key is event_id itself), so
-- the claim stays the insert-first claim of adr/0001: one probe, decided
-- by the key, whatever the ids look like. Ids of any other version fall
-- wherever their first 48 bits put them, almost all in the year
-- partitions or processed_event_after, and retention deletes them by age
-- as before.
--
-- Partitions, lowest keys first, together covering every key:
--   processed_event_before    MINVALUE .. 33 days before this migration
--   processed_event_dYYYYMMDD one per UTC day, 33 days back, 31 ahead
--   processed_event_yYYYY     the rest of this year, each year for ten
--                             years, then each decade, to 2099
--   processed_event_after     2100-01-01 .. MAXVALUE
--   processed_event_default   the ranges of the days retention dropped
-- inbox_maintain carves the next days out of the year partitions ahead of
-- time, and drops the days past the TTL. The days back are the default
-- TTL's and the prune's two days more (db.Prune): late events, and claims
-- loaded into a new inbox (bench scale), land in days too; the first
-- maintenance drops those past a shorter TTL, empty.
--
-- An inbox that already holds claims keeps them: the table is renamed
-- processed_event_legacy and stays where it is, read only, and every claim
-- looks it up too (claim_taken, apply_event, apply_batch) until
-- inbox_maintain drops it, once its newest row is older than the TTL.
DO $$
DECLARE
    today DATE := (now() AT TIME ZONE 'UTC')::date;
    first DATE := today - 33;
    last  DATE := today + 31;
    d     DATE;
    y     INT;
    next_y INT;
    lo    DATE;
    grantee RECORD;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = to_regclass('processed_event')) = 'p' THEN
        RETURN;
    END IF;
    LOCK TABLE processed_event IN ACCESS EXCLUSIVE MODE;
    IF EXISTS (SELECT 1 FROM processed_event) THEN
        ALTER TABLE processed_event RENAME TO processed_event_legacy;
        ALTER INDEX processed_event_pkey RENAME TO processed_event_legacy_pkey;
        ALTER INDEX processed_event_processed_at RENAME TO processed_event_legacy_processed_at;
    ELSE
        DROP TABLE processed_event;
    END IF;

    -- The key and the index are made once the partitions are: one
    -- statement each then makes them on every partition, which takes about
    -- half the time of making them with each partition.
    CREATE TABLE processed_event (
        event_id     UUID        NOT NULL,
        event_type   TEXT        NOT NULL,
        processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        fingerprint  BYTEA       NOT NULL
    ) PARTITION BY RANGE (event_id);

    -- The roles granted the old table are granted the new one.
    IF to_regclass('processed_event_legacy') IS NOT NULL THEN
        FOR grantee IN
            SELECT g.grantee, g.privilege_type FROM information_schema.role_table_grants g
            WHERE g.table_schema = current_schema() AND g.table_name = 'processed_event_legacy'
              AND g.grantee <> current_user
        LOOP
            EXECUTE format('GRANT %s ON processed_event TO %s', grantee.privilege_type,
                CASE WHEN grantee.grantee = 'PUBLIC' THEN 'PUBLIC' ELSE quote_ident(grantee.grantee) END);
        END LOOP;
    END IF;

    -- The bound of day d is inbox_day_bound(d): the smallest version-7 id
    -- of its first millisecond.
    EXECUTE format('CREATE TABLE processed_event_before PARTITION OF processed_event FOR VALUES FROM (MINVALUE) TO (%L)',
        inbox_day_bound(first));
    d := first;
    WHILE d <= last LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF processed_event FOR VALUES FROM (%L) TO (%L)',
            'processed_event_d' || to_char(d, 'YYYYMMDD'),
            inbox_day_bound(d), inbox_day_bound(d + 1));
        d := d + 1;
    END LOOP;
    -- Years for a decade, then decades: fewer partitions to make for a
    -- new database. inbox_maintain carves days off either alike.
    lo := last + 1;
    y := extract(year FROM lo)::int;
    WHILE y < 2100 LOOP
        next_y := least(CASE WHEN y < extract(year FROM today)::int + 10 THEN y + 1 ELSE y + 10 END, 2100);
        EXECUTE format('CREATE TABLE %I PARTITION OF processed_event FOR VALUES FROM (%L) TO (%L)',
            'processed_event_y' || y, inbox_day_bound(lo), inbox_day_bound(make_date(next_y, 1, 1)));
        y := next_y;
        lo := make_date(y, 1, 1);
    END LOOP;
    EXECUTE format('CREATE TABLE processed_event_after PARTITION OF processed_event FOR VALUES FROM (%L) TO (MAXVALUE)',
        inbox_day_bound(lo));
    CREATE TABLE processed_event_default PARTITION OF processed_event DEFAULT;
    ALTER TABLE processed_event ADD PRIMARY KEY (event_id);
    CREATE INDEX processed_event_processed_at ON processed_event (processed_at);
END $$;
