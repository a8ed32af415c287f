-- What lets a queue's lane go on from its journal mark without reading the
-- journal (adr/0014, "A start during an alarm"). Each time a read of the
-- journal syncs a queue's lane, the database holding every entry of the
-- queue the journal holds, the service records here which database that
-- was: the cluster (its system identifier), this database, the file of
-- this table, the timeline, and the transaction that wrote it. While a
-- broker alarm or an unavailable stream holds the read (its fence is a
-- publish), the lane goes on from the mark when all of these are still
-- the same and the transaction is committed here: the database then has
-- lost no commit since, so the journal holds no entry of the queue above
-- the mark. A failover or a point-in-time restore changes the timeline, a
-- logical restore the cluster, the database or the file; the lane then
-- waits for the read, as before.
--
-- Written by the service, once per sync, on the row journal_advance moves
-- (still a HOT update: no index covers these). Written to run again
-- harmlessly.

ALTER TABLE journal_mark
    ADD COLUMN IF NOT EXISTS vouched_system   BIGINT,
    ADD COLUMN IF NOT EXISTS vouched_database BIGINT,
    ADD COLUMN IF NOT EXISTS vouched_file     BIGINT,
    ADD COLUMN IF NOT EXISTS vouched_timeline BIGINT,
    ADD COLUMN IF NOT EXISTS vouched_by       xid8;
