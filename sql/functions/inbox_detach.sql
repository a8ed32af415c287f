-- inbox_detach detaches partition part from processed_event, for
-- inbox_maintain, which alone calls it. The first call of a transaction
-- locks processed_event (ACCESS EXCLUSIVE) until the transaction ends, so
-- that no claim meets a range without its partition, or a row on its way
-- to another partition, in between.

CREATE OR REPLACE FUNCTION inbox_detach(part REGCLASS) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE processed_event IN ACCESS EXCLUSIVE MODE;
    EXECUTE format('ALTER TABLE processed_event DETACH PARTITION %s', part);
END $$;
