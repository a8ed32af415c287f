-- No index on the transfers' intent (adr/0012).
--
-- transfer_intent served one query: reconciliation's search for repeated
-- intents (db/reconcile_sql.go). Each creation wrote an entry at the end
-- of its paying account's entries, and after every checkpoint the first
-- creation of each paying account wrote an image of that whole leaf to
-- the WAL: with as many paying accounts as events between two
-- checkpoints, about one 8 KB image per event, the largest cost left in
-- an event's WAL once the inbox and the transfers' key grow at their
-- right edge (BENCHMARKS.md, "100 million rows without transfer_intent").
-- The search now sorts the transfers itself, once a pass.
--
-- Dropping an index changes only the catalog: the lock it takes on
-- transfer lasts as long as the migrator's transaction. Written to run
-- again harmlessly.

DROP INDEX IF EXISTS transfer_intent;
