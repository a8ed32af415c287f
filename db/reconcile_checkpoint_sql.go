package db

import "fmt"

// The checkpoint's queries (adr/0007, "The periodic pass").

// timelineSQL is the timeline the server writes its WAL on, from the name
// of its current WAL file (whose first eight hex digits it is); NULL on a
// standby, which writes none, and for a role that may not ask.
// pg_control_checkpoint() would say it only after the next checkpoint:
// a promotion does not wait for one.
const timelineSQL = `CASE WHEN NOT pg_is_in_recovery()
        AND has_function_privilege('pg_walfile_name(pg_lsn)', 'execute')
        AND has_function_privilege('pg_current_wal_lsn()', 'execute')
    THEN ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint END`

// systemSQL is the cluster's system identifier (pg_control_system()), the
// same on a primary and its standbys, another in a cluster made anew (a
// logical restore); 0 for a role that may not ask.
const systemSQL = `coalesce(CASE WHEN has_function_privilege('pg_control_system()', 'execute')
    THEN (SELECT system_identifier FROM pg_control_system()) END, 0)`

// checkpointQuery reads the checkpoint and says why it cannot be trusted:
// broken (the cut-off's transaction ids do not belong to this database:
// none, or a pass forgot it (neutralize), another cluster's, ahead of the database's own, or not committed
// here; or a transfer it holds is gone), so that even a comparison with it
// means nothing; or distrusted (the timeline changed, or a pass or a
// person marked it), so that a full pass makes it anew, comparing with it
// first. Both NULL: the periodic pass may start from it.
//
// A database restored to a point before the checkpoint was written holds
// the checkpoint of that point, written with the transfers it holds: it
// moves back with them. What these tests catch is a checkpoint that does
// not come from the same history as the transfers: a logical dump
// restored into another cluster (whose transaction ids start afresh, so
// that new transfers would look older than the cut-off), tables restored
// one by one, a row edited by hand.
const checkpointQuery = `
SELECT c.cutoff::text AS cutoff, c.forgotten, c.written_at, c.rebuilt_at, c.full_at, c.swept_to,
       pg_snapshot_xmin(c.cutoff)::text::bigint AS cutoff_xmin,
       CASE
           WHEN c.cutoff IS NULL THEN coalesce(c.forgotten, 'there is none')
           WHEN c.written_by IS NULL OR c.system_identifier IS NULL THEN 'it is incomplete'
           WHEN c.system_identifier IS DISTINCT FROM s.id
               THEN format('it was written in another cluster (system identifier %s; this one''s is %s): a logical restore', c.system_identifier, s.id)
           WHEN c.written_by >= pg_snapshot_xmax(pg_current_snapshot())
               THEN format('its transaction (%s) is ahead of the database''s own (%s): a restore to a point before it', c.written_by, pg_snapshot_xmax(pg_current_snapshot()))
           WHEN pg_xact_status(c.written_by) IS DISTINCT FROM 'committed'
               THEN format('its transaction (%s) is not known committed in this database', c.written_by)
           WHEN (SELECT count(*) FROM transfer t, unnest(c.witness_ids, c.witness_xids) w(id, xid)
                 WHERE t.transfer_id = w.id AND t.created_xid = w.xid) < coalesce(cardinality(c.witness_ids), 0)
               THEN 'transfers it holds are gone: the transfer table was restored, or changed by hand'
       END AS broken,
       CASE
           WHEN c.cutoff IS NULL THEN NULL
           WHEN c.distrust IS NOT NULL THEN c.distrust
           WHEN s.timeline IS NOT NULL AND c.timeline IS DISTINCT FROM s.timeline
               THEN format('it was written on timeline %s, the database is on %s: a failover or a point-in-time restore since', c.timeline, s.timeline)
       END AS distrusted
FROM reconcile_checkpoint c, (SELECT ` + systemSQL + ` AS id, ` + timelineSQL + ` AS timeline) s`

// The periodic pass's working sets are the unlogged tables
// reconcile_pass_* (sql/0016), empty between passes: emptyWork empties
// them, before a pass's work and again before its commit.
const emptyWork = `DELETE FROM reconcile_pass_new; DELETE FROM reconcile_pass_delta; DELETE FROM reconcile_pass_candidate;
DELETE FROM reconcile_pass_drift; DELETE FROM reconcile_pass_duplicate; DELETE FROM reconcile_pass_waiting;
DELETE FROM reconcile_pass_full`

// newSince fills reconcile_pass_new: the transfers created, or failed,
// since the cut-off $1 (xmin $2) (sinceCutSQL).
var newSince = `INSERT INTO reconcile_pass_new` +
	fmt.Sprintf(sinceCutSQL, "$1::pg_snapshot", "$2::bigint")

// deltaSince fills reconcile_pass_delta: what reconcile_pass_new moved,
// per account.
var deltaSince = `INSERT INTO reconcile_pass_delta
SELECT account, sum(delta)::bigint AS delta FROM (` + fmt.Sprintf(movedSQL, "reconcile_pass_new") + `) m GROUP BY account`

// sweepEnd is the account $2 accounts after $1 in balance_projection, the
// end of this pass's part of the sweep; no row when fewer are left.
const sweepEnd = `SELECT account FROM balance_projection WHERE account > $1 ORDER BY account OFFSET $2::int - 1 LIMIT 1`

// candidates fills reconcile_pass_candidate: the accounts the periodic pass
// compares. Those the transfers since the cut-off moved; those found in
// drift before, until a pass finds them mended; and the sweep's part, the
// accounts in ($1, $2] ($2 NULL: to the end), of balance_projection and of
// the checkpoint both, so that a balance changed, made or deleted by hand
// is found within a round of the sweep.
const candidates = `INSERT INTO reconcile_pass_candidate
SELECT account FROM reconcile_pass_delta
UNION SELECT subject FROM reconcile_finding WHERE kind = 'drift'
UNION SELECT account FROM balance_projection WHERE account > $1 AND ($2::text IS NULL OR account <= $2)
UNION SELECT account FROM reconcile_checkpoint_net WHERE account > $1 AND ($2::text IS NULL OR account <= $2)`

// periodicDrift fills reconcile_pass_drift: each candidate whose balance is not
// what the checkpoint and the transfers since say. As in the full pass, an
// account with transfers (a row in the checkpoint, or a movement since)
// but no balance row is drift, and a balance without transfers must be 0.
const periodicDrift = `INSERT INTO reconcile_pass_drift
SELECT c.account, coalesce(n.net_minor, 0) + coalesce(d.delta, 0) AS expected, b.balance_minor AS actual,
       coalesce(b.balance_minor, 0) - coalesce(n.net_minor, 0) - coalesce(d.delta, 0) AS difference
FROM reconcile_pass_candidate c
LEFT JOIN reconcile_checkpoint_net n ON n.account = c.account
LEFT JOIN reconcile_pass_delta d ON d.account = c.account
LEFT JOIN balance_projection b ON b.account = c.account
WHERE (b.account IS NULL AND (n.account IS NOT NULL OR d.account IS NOT NULL))
   OR b.balance_minor <> coalesce(n.net_minor, 0) + coalesce(d.delta, 0)`

// recentDuplicates fills reconcile_pass_duplicate: duplicateQuery over the
// transfers created from the window $1 before the earliest creation since
// the cut-off, keeping the pairs of which one was created since: a pair
// of two older creations was a pair for the pass before. Both creations of
// a pair are at most the window apart, so both are among those read, and
// so is every creation of the intent between them. The transfers of the
// window are found by the BRIN index on created_at.
const recentDuplicates = `INSERT INTO reconcile_pass_duplicate
WITH recent AS (
    SELECT transfer_id, from_account, to_account, amount_minor, currency, state, created_at FROM transfer
    WHERE created_at >= (SELECT min(created_at) FROM reconcile_pass_new WHERE created) - $1::interval
), candidate AS (
    SELECT DISTINCT from_account, to_account, amount_minor, currency
    FROM (SELECT from_account, to_account, amount_minor, currency,
                 created_at - lag(created_at) OVER (PARTITION BY from_account, to_account, amount_minor, currency
                                                    ORDER BY created_at) AS gap
          FROM recent) t
    WHERE gap <= $1::interval
), pair AS (
    SELECT t.from_account, t.to_account, t.amount_minor, t.currency, t.transfer_id, t.created_at,
           lag(t.transfer_id) OVER w AS earlier_transfer_id, lag(t.created_at) OVER w AS earlier_created_at
    FROM recent t JOIN candidate c USING (from_account, to_account, amount_minor, currency)
    WHERE t.state <> 'failed'
    WINDOW w AS (PARTITION BY t.from_account, t.to_account, t.amount_minor, t.currency ORDER BY t.created_at)
)
SELECT from_account, to_account, amount_minor, currency, transfer_id, created_at, earlier_transfer_id, earlier_created_at
FROM pair
WHERE created_at - earlier_created_at <= $1::interval
  AND NOT EXISTS (SELECT 1 FROM reconcile_dismissed d WHERE d.transfer_id = pair.transfer_id)
  AND (transfer_id IN (SELECT transfer_id FROM reconcile_pass_new WHERE created)
       OR earlier_transfer_id IN (SELECT transfer_id FROM reconcile_pass_new WHERE created))`

// moveCheckpoint adds what the transfers since the cut-off moved to the
// checkpoint's nets, and moves its cut-off to this pass's snapshot, the
// sweep to $1, and its witnesses to the newest transfers since, if any.
const moveCheckpoint = `
WITH nets AS (
    INSERT INTO reconcile_checkpoint_net AS c (account, net_minor)
    SELECT d.account, coalesce(n.net_minor, 0) + d.delta
    FROM reconcile_pass_delta d LEFT JOIN reconcile_checkpoint_net n ON n.account = d.account
    ON CONFLICT (account) DO UPDATE SET net_minor = EXCLUDED.net_minor
), w AS (
    SELECT array_agg(transfer_id ORDER BY created_xid DESC) AS ids, array_agg(created_xid ORDER BY created_xid DESC) AS xids
    FROM (SELECT transfer_id, created_xid FROM reconcile_pass_new WHERE created ORDER BY created_xid DESC LIMIT 4) x
)
UPDATE reconcile_checkpoint SET cutoff = pg_current_snapshot(), written_by = pg_current_xact_id(), written_at = now(),
    swept_to = $1, witness_ids = coalesce(w.ids, witness_ids), witness_xids = coalesce(w.xids, witness_xids)
FROM w`

// rebuildCheckpoint makes the checkpoint anew from a full pass's nets
// (reconcile_pass_full, kind net): the accounts gone are deleted, the others
// written where they differ.
const rebuildCheckpoint = `
WITH gone AS (
    DELETE FROM reconcile_checkpoint_net c
    WHERE NOT EXISTS (SELECT 1 FROM reconcile_pass_full f WHERE f.kind = 'net' AND f.account = c.account)
)
INSERT INTO reconcile_checkpoint_net AS c (account, net_minor)
SELECT account, expected FROM reconcile_pass_full WHERE kind = 'net'
ON CONFLICT (account) DO UPDATE SET net_minor = EXCLUDED.net_minor WHERE c.net_minor <> EXCLUDED.net_minor`

// rebuiltHeader writes the rebuilt checkpoint's cut-off (this pass's
// snapshot), where it was written, and its witnesses: the newest
// transfers among those of the last million transaction ids, found by
// the BRIN index.
const rebuiltHeader = `
WITH w AS (
    SELECT array_agg(transfer_id ORDER BY created_xid DESC) AS ids, array_agg(created_xid ORDER BY created_xid DESC) AS xids
    FROM (SELECT transfer_id, created_xid FROM transfer
          WHERE created_xid >= pg_snapshot_xmin(pg_current_snapshot())::text::bigint - 1000000
            AND pg_visible_in_snapshot(created_xid::text::xid8, pg_current_snapshot())
          ORDER BY created_xid DESC LIMIT 4) x
)
UPDATE reconcile_checkpoint SET cutoff = pg_current_snapshot(), forgotten = NULL, system_identifier = (` + systemSQL + `),
    timeline = ` + timelineSQL + `, written_by = pg_current_xact_id(), written_at = now(),
    witness_ids = coalesce(w.ids, '{}'), witness_xids = coalesce(w.xids, '{}'),
    distrust = NULL, rebuilt_at = now(), full_at = now(), swept_to = ''
FROM w`
