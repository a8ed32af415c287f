-- Reconciliation from a checkpoint (adr/0007, "The periodic pass"). A
-- full pass sums every transfer ever made; the periodic pass keeps, per
-- account, what the transfers up to a cut-off sum to, and adds only what
-- was committed after it.
--
-- The cut-off is a snapshot (pg_current_snapshot() of the pass that wrote
-- the checkpoint): a transfer is in the checkpoint exactly when the
-- transaction that made it is visible in that snapshot. Neither a time nor
-- an id is: both are taken before the commit, and commits finish in
-- another order. So each transfer keeps the id of the transaction that
-- made it (created_xid, its xid8 as a number, the column's default, so
-- that apply_effect and every release's apply_event fill it without a
-- change), and each failure, the one change of a transfer that moves
-- money, is written down with the id of its transaction
-- (transfer_failure, by set_transfer_state). Transfers made before this
-- migration have no created_xid: they are in every checkpoint, since the
-- first is made after it.
--
-- Both are found by BRIN indexes, not B-trees: a BRIN summary of a range
-- of pages is written once the range is full (autosummarize), not at each
-- insert, so the rows an event writes cost no index entry, where a B-tree
-- on created_xid cost each creation an entry (BENCHMARKS.md, "What the
-- checkpoint costs the apply path"). A transfer's row is
-- written at the table's end and its created_xid never changes, so the
-- ranges the periodic pass reads are those written since the cut-off. The
-- index holds created_at too, for the duplicate intents of the last
-- window. Neither column changes after the insert, so a completion or a
-- failure stays a HOT update.
--
-- An older release running beside this one during a rolling deploy runs
-- the functions of this one (db.Migrate keeps a newer release's) and
-- never reads these tables; its own reconcile reads only what it read
-- before.
--
-- CREATE INDEX holds off writes to transfer while it reads the table
-- (BRIN reads it once and sorts nothing, BENCHMARKS.md). Written to run
-- again harmlessly.

ALTER TABLE transfer ADD COLUMN IF NOT EXISTS created_xid BIGINT;
ALTER TABLE transfer ALTER COLUMN created_xid SET DEFAULT pg_current_xact_id()::text::bigint;

CREATE INDEX IF NOT EXISTS transfer_created_range ON transfer
    USING brin (created_xid, created_at) WITH (autosummarize = on);

-- One row per transfer that failed, written in the failure's transaction,
-- with what the pass needs of the transfer (its accounts, its amount, and
-- the transaction that created it), so that it reads only these rows, and
-- never the transfer's, wherever in the history that is. Only inserted,
-- never updated: its pages fill in the order of the failures.
CREATE TABLE IF NOT EXISTS transfer_failure (
    transfer_id  UUID   NOT NULL,
    from_account TEXT   NOT NULL,
    to_account   TEXT   NOT NULL,
    amount_minor BIGINT NOT NULL,
    created_xid  BIGINT,
    failed_xid   BIGINT NOT NULL DEFAULT pg_current_xact_id()::text::bigint
);
CREATE INDEX IF NOT EXISTS transfer_failure_range ON transfer_failure
    USING brin (failed_xid) WITH (autosummarize = on);

-- CREATE INDEX summarizes the table's last range too, though it is not
-- full: each insert into a summarized range widens its summary, one WAL
-- record (about 70 bytes) each, until the range fills. Without its
-- summary, an insert there writes nothing to the index; autosummarize and
-- VACUUM summarize only full ranges, so the range being filled never has
-- one again, and the pass reads it whole, as it must.
SELECT brin_desummarize_range(i::regclass, greatest(pg_relation_size(t::regclass) / current_setting('block_size')::int - 1, 0))
FROM (VALUES ('transfer_created_range', 'transfer'), ('transfer_failure_range', 'transfer_failure')) AS x(i, t);

-- The checkpoint: one row, made here empty (cutoff NULL: no checkpoint
-- yet, the next pass is a full one and makes it). Only the service's
-- reconciliation writes it, under its advisory lock; a person who wants
-- the next pass to be a full one sets distrust to why.
CREATE TABLE IF NOT EXISTS reconcile_checkpoint (
    one               BOOLEAN     PRIMARY KEY DEFAULT true CHECK (one),
    -- The snapshot the sums are of, and where it was taken: the cluster
    -- (pg_control_system()), the timeline, and the transaction that wrote
    -- the row, which must be committed in the database that reads it.
    cutoff            pg_snapshot,
    system_identifier BIGINT,
    timeline          BIGINT,
    written_by        XID8,
    written_at        TIMESTAMPTZ,
    -- A few transfers the checkpoint holds, newest first, with their
    -- created_xid: a transfer table restored apart from this row lacks
    -- them.
    witness_ids       UUID[],
    witness_xids      BIGINT[],
    -- The balances the periodic passes compared, in account order, up to
    -- this account ('' at the start of a round).
    swept_to          TEXT        NOT NULL DEFAULT '',
    -- Set by a pass (or a person) that found the checkpoint not to be
    -- trusted: the next periodic pass is a full one, which makes it anew.
    distrust          TEXT,
    rebuilt_at        TIMESTAMPTZ,
    -- The last full pass, on whichever server it read, and one on a
    -- standby under way (claimed until then).
    full_at           TIMESTAMPTZ,
    full_claimed_until TIMESTAMPTZ
);
INSERT INTO reconcile_checkpoint DEFAULT VALUES ON CONFLICT DO NOTHING;

-- Per account with transfers up to the cut-off, their net.
CREATE TABLE IF NOT EXISTS reconcile_checkpoint_net (
    account   TEXT   PRIMARY KEY,
    net_minor BIGINT NOT NULL
);

-- What a pass found, kept until a later pass finds it resolved: a drift
-- (subject: the account), a duplicate intent (the later transfer) or a
-- waiting transition (the transfer).
CREATE TABLE IF NOT EXISTS reconcile_finding (
    kind       TEXT        NOT NULL CHECK (kind IN ('drift', 'duplicate', 'waiting')),
    subject    TEXT        NOT NULL,
    detail     JSONB       NOT NULL,
    first_seen TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_seen  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, subject)
);

-- The working sets of a pass, filled and emptied within its transaction,
-- under the reconciliation's lock: one pass at a time writes them, and
-- they are empty between passes. Tables of the schema, not temporary
-- ones, since the service's role may not create any (db.Grant); unlogged,
-- since nothing in them outlives the transaction, so that they cost no
-- WAL (and a standby has none: a pass there reads only).
CREATE UNLOGGED TABLE IF NOT EXISTS reconcile_pass_new (
    transfer_id UUID, from_account TEXT, to_account TEXT, amount_minor BIGINT, currency TEXT, state TEXT,
    created_at TIMESTAMPTZ, created_xid BIGINT, created BOOLEAN);
CREATE UNLOGGED TABLE IF NOT EXISTS reconcile_pass_delta (account TEXT, delta BIGINT);
CREATE UNLOGGED TABLE IF NOT EXISTS reconcile_pass_candidate (account TEXT);
CREATE UNLOGGED TABLE IF NOT EXISTS reconcile_pass_drift (account TEXT, expected BIGINT, actual BIGINT, difference BIGINT);
CREATE UNLOGGED TABLE IF NOT EXISTS reconcile_pass_duplicate (
    from_account TEXT, to_account TEXT, amount_minor BIGINT, currency TEXT,
    transfer_id UUID, created_at TIMESTAMPTZ, earlier_transfer_id UUID, earlier_created_at TIMESTAMPTZ);
CREATE UNLOGGED TABLE IF NOT EXISTS reconcile_pass_waiting (
    transfer_id UUID, event_id UUID, event_type TEXT, from_account TEXT, to_account TEXT, amount_minor BIGINT,
    currency TEXT, received_at TIMESTAMPTZ);
CREATE UNLOGGED TABLE IF NOT EXISTS reconcile_pass_full (
    kind TEXT, account TEXT, expected BIGINT, actual BIGINT, difference BIGINT, total BIGINT);
