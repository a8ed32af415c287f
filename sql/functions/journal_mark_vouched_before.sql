-- Made before the numbered migrations, which may call it.
-- journal_mark_vouched_before is the trigger of sql/0018: it turns the
-- record a release before 0018 writes when a read of the journal synced a
-- queue (the cluster, database, file and timeline, beside vouched_by) into
-- this release's (the server's run, beside vouched_by), so that such a
-- release's lanes go on during a rolling deploy. It fires only on a row
-- that carries the old record, never on this release's writes.

CREATE OR REPLACE FUNCTION journal_mark_vouched_before() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.vouched_run := CASE WHEN NEW.vouched_by IS NOT NULL THEN pg_postmaster_start_time() END;
    NEW.vouched_system := NULL;
    NEW.vouched_database := NULL;
    NEW.vouched_file := NULL;
    NEW.vouched_timeline := NULL;
    RETURN NEW;
END $$;
