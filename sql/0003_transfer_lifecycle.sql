-- Each transfer's state: created, then completed or failed. Written in the
-- transaction of the event that changes it, after that event's inbox claim.
CREATE TABLE transfer (
    transfer_id      UUID        PRIMARY KEY,
    from_account     TEXT        NOT NULL,
    to_account       TEXT        NOT NULL,
    amount_minor     BIGINT      NOT NULL,
    currency         TEXT        NOT NULL,
    state            TEXT        NOT NULL CHECK (state IN ('created', 'completed', 'failed')),
    created_event_id UUID        NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- A TransferCompleted or TransferFailed that arrived before its
-- TransferCreated waits here (its inbox claim already committed with it) and
-- is applied in the transaction of the TransferCreated. At most one per
-- transfer: a second, contradicting one is dead-lettered on arrival.
CREATE TABLE pending_transition (
    transfer_id  UUID        PRIMARY KEY,
    event_id     UUID        NOT NULL,
    event_type   TEXT        NOT NULL CHECK (event_type IN ('TransferCompleted', 'TransferFailed')),
    from_account TEXT        NOT NULL,
    to_account   TEXT        NOT NULL,
    amount_minor BIGINT      NOT NULL,
    currency     TEXT        NOT NULL,
    received_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
