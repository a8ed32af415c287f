-- The inbox. Its primary key is where correctness lives: a second claim of
-- the same event_id cannot succeed, whatever the timing (see adr/0001).
CREATE TABLE processed_event (
    event_id     UUID        PRIMARY KEY,
    event_type   TEXT        NOT NULL,
    processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- SHA-256 of the event's canonical content: the same event_id with
    -- another fingerprint is a producer conflict, not a redelivery.
    fingerprint  BYTEA       NOT NULL
);

-- Retention deletes by age in small batches (see adr/0003).
CREATE INDEX processed_event_processed_at ON processed_event (processed_at);

-- The projection the events maintain. Balances only ever change by
-- balance_minor = balance_minor + delta, so the order of events does not
-- matter to them.
CREATE TABLE balance_projection (
    account       TEXT        PRIMARY KEY,
    balance_minor BIGINT      NOT NULL DEFAULT 0,
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);
