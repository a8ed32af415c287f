-- When each transfer was created, for reconciliation (adr/0007): two
-- creations of the same intent (the same accounts, amount and currency)
-- under different transferIds a short time apart are a producer's
-- duplicate the inbox cannot see, since each came under its own eventId.
--
-- created_at is the time of the transaction that applied the creation
-- (its now()), the column's default: apply_effect (sql/functions/) names the
-- columns it inserts, so apply_event and apply_batch fill it without a
-- change. Rows made before this migration get the best time left of
-- their creation: the inbox row of the event that created them while
-- retention keeps it, else updated_at, which is the creation's time for a
-- transfer still created and the time of its completion or failure (at
-- most one transition later) otherwise.
--
-- The index serves reconcile's search for repeated intents: it walks the
-- index in intent order, then time, comparing each creation with the one
-- before it, without sorting the table. It holds no column a transition
-- changes (state, updated_at), so a completion or failure writes no entry
-- in it.
--
-- The whole file runs in the migrator's transaction: the transfer table is
-- locked against the service while its rows are rewritten, about 13 s
-- per million rows here (BENCHMARKS.md).
--
-- Written to run again harmlessly.

ALTER TABLE transfer ADD COLUMN IF NOT EXISTS created_at TIMESTAMPTZ;

UPDATE transfer t
SET created_at = coalesce(
    (SELECT p.processed_at FROM processed_event p WHERE p.event_id = t.created_event_id),
    t.updated_at)
WHERE t.created_at IS NULL;

ALTER TABLE transfer
    ALTER COLUMN created_at SET DEFAULT now(),
    ALTER COLUMN created_at SET NOT NULL;

CREATE INDEX IF NOT EXISTS transfer_intent
    ON transfer (from_account, to_account, amount_minor, currency, created_at);

-- A suspected duplicate that a person looked into and found meant (two
-- payments, confirmed with the producer) is dismissed here, by the
-- transferId of the later creation, with why: reconcile reports it no
-- more. Only people write it; the service only reads it.
CREATE TABLE IF NOT EXISTS reconcile_dismissed (
    transfer_id  UUID        PRIMARY KEY,
    note         TEXT        NOT NULL,
    dismissed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
