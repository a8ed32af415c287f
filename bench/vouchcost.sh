#!/usr/bin/env bash
# What journal_advance's vouch check costs a transaction (adr/0014, "A
# handover across a failover"), in a scratch server of its own with fsync
# off (journal_advance raises synchronous_commit to on for an attempt's
# move, so that on a server that syncs, the disk's flush would hide it),
# migrated by the service: 20,000 moves of a mark, one transaction each (a
# DO block that commits after each), three rounds, interleaved:
#   - an attempt's move, which checks that the database vouches for the
#     mark (journal_mark_doubt: the server's run and the row's xmin) and
#     writes the same of itself;
#   - a restore's move, which does not check: the cost before the check.
# From the repository root: bench/vouchcost.sh (PG_BINDIR: PostgreSQL's
# server programs, default Debian's 15; run as root, the server runs as
# the postgres user, or as the user who runs it).
set -euo pipefail
bin=${PG_BINDIR:-/usr/lib/postgresql/15/bin}
as() { if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
dir=$(mktemp -d)
[[ $(id -u) == 0 ]] && chown postgres "$dir"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
as "$bin/initdb" -D "$dir/data" -A trust -U postgres --no-sync >/dev/null
as "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
  -o "-p $port -c listen_addresses=127.0.0.1 -k $dir/data -c fsync=off" start >/dev/null
trap 'as "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null; rm -rf "$dir"' EXIT
url="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
DATABASE_URL=$url go run . migrate >/dev/null
psql "$url" -q 2>&1 <<'SQL' | sed -n 's/.*NOTICE: *//p'
INSERT INTO journal_mark (queue, seq) VALUES ('bench', 0);
DO $$
DECLARE s BIGINT; t0 TIMESTAMPTZ; n CONSTANT INT := 20000; kind TEXT;
BEGIN
    FOR round IN 1 .. 3 LOOP
        FOREACH kind IN ARRAY ARRAY['attempt', 'restore'] LOOP
            -- A read's vouch, as db's Vouch writes it: a restore's moves
            -- clear it.
            UPDATE journal_mark SET vouched_by = pg_current_xact_id(), vouched_run = pg_postmaster_start_time()
                WHERE queue = 'bench';
            COMMIT;
            t0 := clock_timestamp();
            FOR i IN 1 .. n LOOP
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
