-- A transition that waited for its creation and turns out to contradict it
-- ends like one that arrives after the creation: not applied, dead-lettered
-- as invalid-transition with its original body, routing key and headers,
-- and no trace in the inbox (so that a replay is judged again). The waiting
-- row keeps what the dead letter needs; the creation's transaction moves it
-- to dead_letter_outbox, which the service publishes after the commit and
-- deletes once the broker confirmed: a crash in between loses nothing.
--
-- A TransferCreated whose inbox row retention pruned long ago (adr/0003)
-- comes back as 'duplicate': the transfer row, created by this very event,
-- proves it was applied.
--
-- The functions that do this (apply_effect, apply_event) are in
-- sql/functions/; here are the columns and the table they need, and the
-- removal of apply_event's first signature, which a new apply_event with
-- the message's columns replaced. Written to run again harmlessly.

ALTER TABLE pending_transition
    ADD COLUMN IF NOT EXISTS routing_key  TEXT,
    ADD COLUMN IF NOT EXISTS body         BYTEA,
    ADD COLUMN IF NOT EXISTS headers      JSONB,
    ADD COLUMN IF NOT EXISTS message_id   TEXT,
    ADD COLUMN IF NOT EXISTS content_type TEXT;

CREATE TABLE IF NOT EXISTS dead_letter_outbox (
    id           BIGSERIAL   PRIMARY KEY,
    event_id     UUID        NOT NULL,
    event_type   TEXT        NOT NULL,
    class        TEXT        NOT NULL,
    reason       TEXT        NOT NULL,
    routing_key  TEXT        NOT NULL,
    body         BYTEA       NOT NULL,
    headers      JSONB,
    message_id   TEXT,
    content_type TEXT,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);

DROP FUNCTION IF EXISTS apply_event(UUID, TEXT, BYTEA, UUID, TEXT, TEXT, BIGINT, TEXT);
