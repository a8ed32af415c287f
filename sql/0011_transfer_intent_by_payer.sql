-- transfer_intent in the order the transfers arrive (adr/0010): the paying
-- account, then the creation's time, then the rest of the intent.
--
-- Before, the account was followed by the payee and the amount, so a new
-- creation landed anywhere among its account's entries: in a table of
-- millions of transfers, on a leaf no other creation since the last
-- checkpoint had touched, whose first change writes an image of the whole
-- page to the WAL (BENCHMARKS.md, "The inbox at scale"). Now a creation's
-- created_at, its transaction's now(), is the latest of its account, so it
-- goes to the end of that account's entries: after a checkpoint, one image
-- per account that pays, however many transfers the table holds.
--
-- Reconciliation's search for repeated intents (db/reconcile_sql.go) can
-- walk the index by account and sort each account's entries by the rest of
-- the intent and time (an incremental sort), where it walked the intent
-- order itself.
--
-- The whole file runs in the migrator's transaction: the transfer table is
-- locked against the service while the index is built (one CREATE INDEX
-- over the table; the scale benchmark builds all four of the inbox's and
-- the transfers' indexes over 10M rows each in about 45 s). Written to run
-- again harmlessly.

DO $$
BEGIN
    IF to_regclass('transfer_intent') IS NULL
       OR pg_get_indexdef(to_regclass('transfer_intent'))
          NOT LIKE '%(from_account, created_at, to_account, amount_minor, currency)' THEN
        DROP INDEX IF EXISTS transfer_intent;
        CREATE INDEX transfer_intent
            ON transfer (from_account, created_at, to_account, amount_minor, currency);
    END IF;
END
$$;
