package reconcile

import "fmt"

// The checkpoint's queries (adr/0007, "The periodic pass").

// checkpointQuery reads the checkpoint and says why it cannot be trusted:
// broken, so that even a comparison with it means nothing (there is none,
// or a pass forgot it, or it is incomplete; it was not written here but
// copied, its cut-off another cluster's; a transfer it holds is gone); or
// distrusted (a pass or a person marked it), so that a full pass makes it
// anew, comparing with it first. Both NULL: the periodic pass may start
// from it.
//
// Written here: its xmin is the transaction stamped in written_by, which
// a trigger restamps at every update of the row (written_here,
// reconcile_checkpoint_stamp, sql/0019). pg_restore and logical
// replication copy the row without firing it. It needs no privilege and
// no transaction status, so it holds on a standby, for any role, and for
// a checkpoint written long ago. A database restored to a point before
// the checkpoint was written (a point-in-time restore, a failover, a cold
// copy) holds the checkpoint of that point, written there with the
// transfers it holds, on the same history of transaction ids: it moves
// back with them and stays exact (adr/0007).
//
// What breaks it is a checkpoint and transfers that do not come from the
// same history, either way round. The checkpoint copied from another
// cluster beside transfers (a dump restored into a cluster made anew,
// logical replication, its table restored on its own) is told here: its
// row's xmin is the copying transaction. Transfers copied from another
// cluster beside a checkpoint written here (a data-only restore, a
// subscription still running into a database that reconciles, the
// transfer table restored on its own) are not told by this query but
// before it, by the pass's neutralization (neutralize): it finds the ids
// this cluster does not see, neutralizes them and forgets the checkpoint
// (cutoff NULL, forgotten saying why), which this query reads as broken;
// a copy that took away transfers the checkpoint holds lacks its
// witnesses. Copied ids that this cluster's snapshots already see look
// like rows the cut-off counted, and nothing tells them (adr/0007, "What
// it cannot prove"). An update of the row by hand, a person's mark
// included, is stamped by the trigger like any other, so it does not
// break it: a person who wants it made anew marks it (distrust).
const checkpointQuery = `
SELECT c.cutoff::text AS cutoff, c.forgotten, c.written_at, c.rebuilt_at, c.full_at, c.swept_to,
       pg_snapshot_xmin(c.cutoff)::text::bigint AS cutoff_xmin,
       CASE
           WHEN c.cutoff IS NULL THEN coalesce(c.forgotten, 'there is none')
           WHEN c.written_by IS NULL THEN 'it is incomplete'
           WHEN NOT written_here(c.xmin, c.written_by)
               THEN format('it was copied, not written here (the row''s transaction %s is not the one stamped in it, %s): '
                           || 'a dump restored or logical replication, whose cut-off may be another cluster''s '
                           || '(or an update made in a subtransaction, or with triggers off)', c.xmin, c.written_by)
           WHEN (SELECT count(*) FROM transfer t, unnest(c.witness_ids, c.witness_xids) w(id, xid)
                 WHERE t.transfer_id = w.id AND t.created_xid = w.xid) < coalesce(cardinality(c.witness_ids), 0)
               THEN 'transfers it holds are gone: the transfer table was restored, or changed by hand'
       END AS broken,
       CASE WHEN c.cutoff IS NOT NULL THEN c.distrust END AS distrusted
FROM reconcile_checkpoint c`

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

// recentDuplicates fills reconcile_pass_duplicate: intentPairsSQL over
// the transfers created from the window $1 before the earliest creation
// since the cut-off, keeping the pairs of which one was created since: a
// pair of two older creations was a pair for the pass before. Both
// creations of a pair are at most the window apart, so both are among
// those read, and so is every creation of the intent between them. The
// transfers of the window are found by the BRIN index on created_at.
var recentDuplicates = `INSERT INTO reconcile_pass_duplicate
WITH recent AS (
    SELECT transfer_id, from_account, to_account, amount_minor, currency, state, created_at FROM transfer
    WHERE created_at >= (SELECT min(created_at) FROM reconcile_pass_new WHERE created) - $1::interval
)
SELECT * FROM (` + fmt.Sprintf(intentPairsSQL, "recent", "$1") + `) pair
WHERE transfer_id IN (SELECT transfer_id FROM reconcile_pass_new WHERE created)
   OR earlier_transfer_id IN (SELECT transfer_id FROM reconcile_pass_new WHERE created)`

// witnessesSQL picks a checkpoint's witnesses among the transfers of
// %[1]s (a relation, with its WHERE if any): the newest four by the
// transaction that created them, as the arrays witness_ids and
// witness_xids take them (ids, xids). The checkpoint's trust compares
// them with the transfers it finds later (checkpointQuery).
const witnessesSQL = `
    SELECT array_agg(transfer_id ORDER BY created_xid DESC) AS ids, array_agg(created_xid ORDER BY created_xid DESC) AS xids
    FROM (SELECT transfer_id, created_xid FROM %[1]s ORDER BY created_xid DESC LIMIT 4) x
`

// moveCheckpoint adds what the transfers since the cut-off moved to the
// checkpoint's nets, and moves its cut-off to this pass's snapshot, the
// sweep to $1, and its witnesses to the newest transfers since, if any.
var moveCheckpoint = `
WITH nets AS (
    INSERT INTO reconcile_checkpoint_net AS c (account, net_minor)
    SELECT d.account, coalesce(n.net_minor, 0) + d.delta
    FROM reconcile_pass_delta d LEFT JOIN reconcile_checkpoint_net n ON n.account = d.account
    ON CONFLICT (account) DO UPDATE SET net_minor = EXCLUDED.net_minor
), w AS (` + fmt.Sprintf(witnessesSQL, `reconcile_pass_new WHERE created`) + `)
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
// snapshot), the transaction that wrote it, and its witnesses: the newest
// transfers among those of the last million transaction ids, found by
// the BRIN index.
var rebuiltHeader = `
WITH w AS (` + fmt.Sprintf(witnessesSQL, `transfer
          WHERE created_xid >= pg_snapshot_xmin(pg_current_snapshot())::text::bigint - 1000000
            AND pg_visible_in_snapshot(created_xid::text::xid8, pg_current_snapshot())`) + `)
UPDATE reconcile_checkpoint SET cutoff = pg_current_snapshot(), forgotten = NULL, written_by = pg_current_xact_id(),
    written_at = now(), witness_ids = coalesce(w.ids, '{}'), witness_xids = coalesce(w.xids, '{}'),
    distrust = NULL, rebuilt_at = now(), full_at = now(), swept_to = ''
FROM w`
