#!/usr/bin/env bash
# What journal_advance's vouch check costs a transaction (adr/0014, "A
# handover across a failover"), in a scratch database migrated by the
# service: 20,000 moves of a mark, one transaction each (a DO block that
# commits after each, synchronous_commit off so that the disk's flush does
# not hide it), three rounds, interleaved:
#   - an attempt's move, which checks the vouch (journal_vouched_here);
#   - the same with the session's copy of the cluster's identifier and the
#     timeline cleared before each, as if read at each transaction;
#   - a restore's move, which does not check: the cost before the check.
# From the repository root: bench/vouchcost.sh (DATABASE_URL: a server
# where the role may create a database; default the local one).
set -euo pipefail
url=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
db=vouchcost_$$
psql "$url" -qc "CREATE DATABASE $db"
trap 'psql "$url" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)"' EXIT
scratch=$(printf "%s" "$url" | sed -E "s#^([a-z]+://[^/]*)/[^?]*#\1/$db#")
DATABASE_URL=$scratch go run . migrate >/dev/null
psql "$scratch" -q 2>&1 <<'SQL' | sed -n 's/.*NOTICE: *//p'
INSERT INTO journal_mark (queue, seq) VALUES ('bench', 0);
UPDATE journal_mark SET (vouched_system, vouched_database, vouched_file, vouched_timeline, vouched_by) =
    (SELECT h.system, h.database, h.file, h.timeline, pg_current_xact_id() FROM journal_here() h) WHERE queue = 'bench';
SET synchronous_commit = off;
DO $$
DECLARE s BIGINT; t0 TIMESTAMPTZ; n CONSTANT INT := 20000; kind TEXT;
BEGIN
    FOR round IN 1 .. 3 LOOP
        FOREACH kind IN ARRAY ARRAY['attempt', 'attempt reading the identity anew', 'restore'] LOOP
            t0 := clock_timestamp();
            FOR i IN 1 .. n LOOP
                IF kind = 'attempt reading the identity anew' THEN
                    PERFORM set_config('transferconsumer.journal_here', '', false);
                END IF;
                SELECT seq INTO s FROM journal_mark WHERE queue = 'bench';
                PERFORM journal_advance('bench', s, s + 1, kind = 'restore');
                COMMIT;
            END LOOP;
            RAISE NOTICE 'round %, %: % µs a transaction', round, kind,
                round(extract(epoch FROM clock_timestamp() - t0) * 1e6 / n, 1);
        END LOOP;
    END LOOP;
END $$;
SQL
