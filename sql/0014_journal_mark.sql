-- The journal's mark (adr/0014). With JOURNAL_STREAM set, the service
-- writes every event it acks to a RabbitMQ stream, with its queue and a
-- sequence number per queue, after the event's transaction committed and
-- before the ack. That transaction also moves the queue's row here to the
-- sequence of its last event (journal_advance), so that the database says
-- exactly which journal entries it holds: every entry of the queue whose
-- sequence is above seq is one the database lost (a failover to a standby
-- that was behind, a point-in-time restore) and the service applies it
-- again from the journal. at is when the mark last moved, or, when later,
-- when the last read of the journal that synced the queue began (db's
-- Vouch): no entry above seq was written before it, so reading the journal
-- may start there.
--
-- One row per queue, updated in place (a HOT update: no index covers seq).
-- Written to run again harmlessly.

CREATE TABLE IF NOT EXISTS journal_mark (
    queue TEXT        PRIMARY KEY,
    seq   BIGINT      NOT NULL,
    at    TIMESTAMPTZ NOT NULL DEFAULT now()
);
