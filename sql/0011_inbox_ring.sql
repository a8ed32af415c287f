-- The inbox becomes a ring of partitions that retention empties by
-- TRUNCATE, so that its cost per event no longer grows with its history
-- and removing a day of rows writes almost no WAL (adr/0009).
--
-- processed_event is LIST-partitioned on slot, a small number the claim
-- computes from its transaction's time (inbox_slot, sql/functions/): the
-- day number modulo the ring's size. inbox_ring holds that size and the
-- slot's width: 32 slots of one day, so 30 days (the default INBOX_TTL,
-- adr/0003) fit with one slot being written and one waiting for its turn
-- to be emptied; `migrate` grows the ring for a longer INBOX_TTL. The primary key (event_id, slot) is unique within each
-- partition only: the claims' advisory lock on the event id (apply_event,
-- apply_batch) is what makes a claim exact across the ring.
--
-- A full inbox in the layout before this migration moves without a stop.
-- In this one transaction, under the migration lock, the old table is
-- renamed processed_event_legacy (a rename, not a copy: instant at any
-- size), the ring is made empty, and migrate then replaces the functions
-- (they run after the numbered migrations, in the same transaction) with
-- ones that look up the legacy table too while it exists. Claims wait on
-- the rename's lock for the few milliseconds the transaction takes; none
-- sees the ring without the legacy lookup. The owner's `migrate` drops the
-- legacy table once its newest row is older than INBOX_TTL
-- (db.DropLegacyInbox); until then retention deletes its expired rows as
-- before. A database with an empty inbox (a new one) has no legacy table.
--
-- processed_at stays, for people and for the prune of a binary older than
-- this migration; its index does not: retention no longer looks rows up by
-- age.
--
-- Written to run again harmlessly: a schema that has the ring already is
-- left as it is.

DO $$
DECLARE
    n    INT;
    part TEXT;
    r    TEXT;
BEGIN
    IF to_regclass('inbox_ring') IS NOT NULL THEN
        RETURN;
    END IF;
    ALTER TABLE processed_event RENAME TO processed_event_legacy;
    ALTER TABLE processed_event_legacy RENAME CONSTRAINT processed_event_pkey TO processed_event_legacy_pkey;
    ALTER INDEX processed_event_processed_at RENAME TO processed_event_legacy_processed_at;

    -- resized_at: when `migrate` last grew the ring (db.SizeRing); rows
    -- claimed before it were placed by the smaller ring's formula, so
    -- retention empties nothing until they are all past the TTL.
    CREATE TABLE inbox_ring (
        one           BOOLEAN     PRIMARY KEY DEFAULT true CHECK (one),
        slots         SMALLINT    NOT NULL CHECK (slots >= 3),
        width_seconds INTEGER     NOT NULL CHECK (width_seconds > 0),
        resized_at    TIMESTAMPTZ NOT NULL DEFAULT '-infinity'
    );
    INSERT INTO inbox_ring (slots, width_seconds) VALUES (32, 86400);

    CREATE TABLE processed_event (
        event_id     UUID        NOT NULL,
        event_type   TEXT        NOT NULL,
        processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        -- SHA-256 of the event's canonical content: the same event_id with
        -- another fingerprint is a producer conflict, not a redelivery.
        fingerprint  BYTEA       NOT NULL,
        slot         SMALLINT    NOT NULL,
        PRIMARY KEY (event_id, slot)
    ) PARTITION BY LIST (slot);

    -- Retention empties a slot with TRUNCATE, which the service's
    -- data-only role may then do on the slots alone: every role that
    -- could write the old inbox gets it here (`migrate --grant-to` gives
    -- it too, db.Grant).
    SELECT slots INTO n FROM inbox_ring;
    FOR i IN 0 .. n - 1 LOOP
        part := format('processed_event_s%s', lpad(i::text, 2, '0'));
        EXECUTE format('CREATE TABLE %I PARTITION OF processed_event FOR VALUES IN (%s)', part, i);
        FOR r IN SELECT DISTINCT grantee FROM information_schema.role_table_grants
                WHERE table_schema = current_schema() AND table_name = 'processed_event_legacy'
                  AND privilege_type = 'INSERT' AND grantee <> current_user AND grantee <> 'PUBLIC' LOOP
            EXECUTE format('GRANT TRUNCATE ON %I TO %I', part, r);
        END LOOP;
    END LOOP;
    IF NOT EXISTS (SELECT 1 FROM processed_event_legacy) THEN
        DROP TABLE processed_event_legacy;
    END IF;
END $$;
