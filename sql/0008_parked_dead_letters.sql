-- Dead letters parked during a broker alarm. While a memory or disk alarm
-- blocks publishing, the copy of a message that goes to the DLQ cannot be
-- confirmed; the service then writes the letter here and acks the message,
-- so that the valid events behind it on its queue go on (adr/0002). The
-- outbox drain publishes it once the alarm passes. A poison message may have
-- no eventId that parses, hence the nullable event_id; queue and failed_at
-- keep what its failure headers say.
--
-- Written to run again harmlessly.

ALTER TABLE dead_letter_outbox ALTER COLUMN event_id DROP NOT NULL;
ALTER TABLE dead_letter_outbox ADD COLUMN IF NOT EXISTS queue TEXT;
