-- Every delivery whose eventId was already applied with other content. The
-- same eventId with another payload is producer corruption: it is never
-- applied, it is dead-lettered, and it is recorded here for an alert to see.
CREATE TABLE producer_conflict (
    id                   BIGSERIAL   PRIMARY KEY,
    event_id             UUID        NOT NULL,
    stored_fingerprint   BYTEA       NOT NULL,
    received_fingerprint BYTEA       NOT NULL,
    received_at          TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX producer_conflict_received_at ON producer_conflict (received_at);
