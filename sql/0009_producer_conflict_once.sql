-- A producer conflict is recorded once: a redelivery of the same
-- conflicting message (the same eventId, the same content as received,
-- against the same stored content) adds no row to producer_conflict. Each
-- delivery is still detected, dead-lettered and counted by the metric as
-- before; a conflict with other content, or against other stored content
-- (the inbox forgot the event and another content was applied since), is
-- still a row of its own, so an alert on new rows sees every conflict.
-- claim_taken (sql/functions/) inserts with ON CONFLICT on the index made
-- here.
--
-- The rows that redeliveries added before this migration are removed,
-- keeping the first of each (its received_at is when the conflict was
-- first seen). The table is locked against inserts meanwhile, so that a
-- replica still running the old claim_taken cannot add a duplicate between
-- the delete and the index.
--
-- Written to run again harmlessly.

LOCK TABLE producer_conflict IN SHARE ROW EXCLUSIVE MODE;

DELETE FROM producer_conflict later
USING producer_conflict first
WHERE later.event_id = first.event_id
  AND later.stored_fingerprint = first.stored_fingerprint
  AND later.received_fingerprint = first.received_fingerprint
  AND later.id > first.id;

CREATE UNIQUE INDEX IF NOT EXISTS producer_conflict_once
    ON producer_conflict (event_id, stored_fingerprint, received_fingerprint);
