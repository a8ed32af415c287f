-- Where the journal's entries wait while its stream does not take them
-- (adr/0014, "When the stream does not take the entries"). With
-- JOURNAL_STREAM set, a transaction's entries go to a RabbitMQ stream
-- after its commit and before its ack. A broker alarm blocks every
-- publish, and a stream can be unavailable while the broker is up; the
-- acks must not wait on either, or the backlog stops. So a queue whose
-- entries the stream has not taken for a while keeps them here, in the
-- order of their sequences, acks their events, and writes them to the
-- stream, oldest first, once it takes them again, deleting each row once
-- confirmed. While a row is here its events are protected against a
-- failover or a restore only as far as this database is: the service
-- counts them (transferconsumer_journal_unprotected_events).
--
-- One row per journal message: the entries of one queue, first_seq to
-- last_seq, as the message's body. Written to run again harmlessly.

CREATE TABLE IF NOT EXISTS journal_spill (
    queue     TEXT        NOT NULL,
    first_seq BIGINT      NOT NULL,
    last_seq  BIGINT      NOT NULL,
    entries   INT         NOT NULL,
    body      BYTEA       NOT NULL,
    at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, first_seq)
);
