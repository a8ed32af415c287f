package reconcile

import "fmt"

// The full pass's queries (adr/0007). Each returns its findings with their
// total count, at most $1 of them but at least one when there is any.

// movedSQL turns each row of the relation %s (transfer, or the transfers
// that changed since a cut-off, sinceCutSQL) into what it moved on each of
// its two accounts. A creation moves amount_minor from from_account to
// to_account and a completion moves nothing; a failure gives the amount
// back, so a failed transfer nets to zero. A row of sinceCutSQL that is a
// failure alone (created false: the creation is in the checkpoint, which
// counted its amount) gives the amount back. A transition still waiting for
// its creation has moved nothing either (it is applied in the creation's
// transaction), so the transfer table alone says what every balance must
// be.
const movedSQL = `
    SELECT from_account AS account,
           CASE WHEN NOT created THEN amount_minor WHEN state = 'failed' THEN 0 ELSE -amount_minor END AS delta
    FROM %[1]s
    UNION ALL
    SELECT to_account,
           CASE WHEN NOT created THEN -amount_minor WHEN state = 'failed' THEN 0 ELSE amount_minor END
    FROM %[1]s`

// sinceCutSQL selects the transfers whose creation, or whose failure,
// committed after the cut-off: the transactions a snapshot (%[1]s, a
// pg_snapshot) does not see, whose ids are at least its xmin (%[2]s, as a
// number). created says which: a row created after the cut-off is one
// (whatever happened to it since); a failure after it, of a transfer
// created before, is the other (its row in transfer_failure holds what
// the pass needs of the transfer, so that the transfer's own row, anywhere
// in the history, is not read). Both are found by their BRIN indexes: only
// the page ranges written since the cut-off are read. A transfer made
// before migration 0016 has no created_xid, and is in every checkpoint.
const sinceCutSQL = `
    SELECT t.transfer_id, t.from_account, t.to_account, t.amount_minor, t.currency, t.state, t.created_at,
           t.created_xid, true AS created
    FROM transfer t
    WHERE t.created_xid >= %[2]s AND NOT pg_visible_in_snapshot(t.created_xid::text::xid8, %[1]s)
    UNION ALL
    SELECT f.transfer_id, f.from_account, f.to_account, f.amount_minor, NULL, 'failed', NULL,
           f.created_xid, false
    FROM transfer_failure f
    WHERE f.failed_xid >= %[2]s AND NOT pg_visible_in_snapshot(f.failed_xid::text::xid8, %[1]s)
      AND (f.created_xid IS NULL OR pg_visible_in_snapshot(f.created_xid::text::xid8, %[1]s))`

// fullQuery compares every balance with the net of its transfers, and,
// with a checkpoint to compare ($2, its cut-off, and $3, that cut-off's
// xmin; both NULL for none), that net with what the checkpoint and the
// transfers since its cut-off say: the two differ only where a transfer
// the checkpoint counted was changed or removed behind the service's back
// (kind changed). With $4 it returns every account's net too (kind net),
// from which the checkpoint is made anew.
//
// A balance (kind drift): an account with transfers but no balance row is
// drift whatever its net, since the creation makes the row; a balance row
// without transfers must be zero (apply_batch makes the rows of a batch's
// accounts before its effects, so a transition that waits leaves zero rows
// behind).
//
// For drift and changed, expected is the net of the account's transfers;
// actual is the balance (drift) or what the checkpoint and the transfers
// since say (changed), NULL when there is no row; difference is actual
// (0 without a row) − expected.
//
// A changed row is kept when reconcile_finding already holds it (a full
// pass on a standby wrote it, and the checkpoint was not made anew since):
// total counts every changed row, fresh those not kept, and the rows
// returned are the fresh ones first.
var fullQuery = `
WITH all_rows AS (
    SELECT from_account, to_account, amount_minor, state, true AS created FROM transfer
), moved AS (` + fmt.Sprintf(movedSQL, "all_rows") + `
), net AS MATERIALIZED (
    SELECT account, sum(delta)::bigint AS expected FROM moved GROUP BY account
), since AS (` + fmt.Sprintf(sinceCutSQL, "$2::pg_snapshot", "$3::bigint") + `
), since_moved AS (` + fmt.Sprintf(movedSQL, "since") + `
), delta AS (
    SELECT account, sum(delta)::bigint AS delta FROM since_moved GROUP BY account
), found AS (
    SELECT 'drift' AS kind, coalesce(n.account, b.account) AS account, coalesce(n.expected, 0) AS expected,
           b.balance_minor AS actual, coalesce(b.balance_minor, 0) - coalesce(n.expected, 0) AS difference
    FROM net n FULL JOIN balance_projection b ON b.account = n.account
    WHERE b.account IS NULL OR b.balance_minor <> coalesce(n.expected, 0)
    UNION ALL
    SELECT 'changed', coalesce(n.account, c.account), coalesce(n.expected, 0),
           CASE WHEN c.account IS NULL AND d.account IS NULL THEN NULL ELSE coalesce(c.net_minor, 0) + coalesce(d.delta, 0) END,
           coalesce(c.net_minor, 0) + coalesce(d.delta, 0) - coalesce(n.expected, 0)
    FROM net n
    FULL JOIN (SELECT * FROM reconcile_checkpoint_net WHERE $2::pg_snapshot IS NOT NULL) c ON c.account = n.account
    LEFT JOIN delta d ON d.account = coalesce(n.account, c.account)
    WHERE $2::pg_snapshot IS NOT NULL
      AND (n.account IS NULL OR (c.account IS NULL AND d.account IS NULL)
           OR n.expected <> coalesce(c.net_minor, 0) + coalesce(d.delta, 0))
), judged AS (
    SELECT f.*, f.kind = 'changed' AND EXISTS (
               SELECT 1 FROM reconcile_finding k, reconcile_checkpoint m
               WHERE k.kind = 'changed' AND k.subject = ` + fmt.Sprintf(changedSubject, "f.account", "m.rebuilt_at", "m.written_at") + `) AS kept
    FROM found f
), numbered AS (
    SELECT *, count(*) OVER (PARTITION BY kind) AS total, count(*) FILTER (WHERE NOT kept) OVER (PARTITION BY kind) AS fresh,
           row_number() OVER (PARTITION BY kind ORDER BY kept, account) AS n
    FROM judged
)
SELECT kind, account, expected, actual, difference::bigint, total, fresh, kept FROM numbered WHERE n <= greatest($1::int, 1)
UNION ALL
SELECT 'net', account, expected, NULL, 0, 0, 0, false FROM net WHERE $4::bool`

// changedSubject names a changed finding in reconcile_finding: the account
// (%[1]s) and when the checkpoint it differs from was made (%[2]s, its
// rebuilt_at, or %[3]s, when it was written, for one without), in UTC to
// the microsecond. A second edit of the account's history, found against
// a checkpoint made after the first was found, is a finding of its own.
const changedSubject = `(%[1]s || '@' || to_char(coalesce(%[2]s, %[3]s) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))`

// intentPairsSQL finds, among the transfers of the relation %[1]s (transfer,
// or the periodic pass's recent ones), the creations that repeat the intent
// of the one before them (the same accounts, amount and currency, another
// transferId) within the window %[2]s (an interval), among transfers that
// moved money: a failed one gave its amount back, and a retry after a
// failure is no duplicate. A creation a person dismissed
// (reconcile_dismissed) is not reported again. It is the one definition
// of a duplicate intent: duplicateQuery (the full pass) and
// recentDuplicates (the periodic pass) both read it.
//
// First the intents that have two creations of any state within the
// window, ordered by intent and time: a sort of the whole relation, since
// no index holds the intent (an index on it cost an event's WAL far more
// than it saved this pass, adr/0012); then, for those few, the pairs among
// the transfers that did not fail. Every such pair is found: between two
// creations at most the window apart, each creation of the same intent
// follows the one before it by less.
const intentPairsSQL = `
WITH candidate AS (
    SELECT DISTINCT from_account, to_account, amount_minor, currency
    FROM (SELECT from_account, to_account, amount_minor, currency,
                 created_at - lag(created_at) OVER (PARTITION BY from_account, to_account, amount_minor, currency
                                                    ORDER BY created_at) AS gap
          FROM %[1]s) t
    WHERE gap <= %[2]s::interval
), pair AS (
    SELECT t.from_account, t.to_account, t.amount_minor, t.currency, t.transfer_id, t.created_at,
           lag(t.transfer_id) OVER w AS earlier_transfer_id, lag(t.created_at) OVER w AS earlier_created_at
    FROM %[1]s t JOIN candidate c USING (from_account, to_account, amount_minor, currency)
    WHERE t.state <> 'failed'
    WINDOW w AS (PARTITION BY t.from_account, t.to_account, t.amount_minor, t.currency ORDER BY t.created_at)
)
SELECT from_account, to_account, amount_minor, currency, transfer_id, created_at, earlier_transfer_id, earlier_created_at
FROM pair
WHERE created_at - earlier_created_at <= %[2]s::interval
  AND NOT EXISTS (SELECT 1 FROM reconcile_dismissed d WHERE d.transfer_id = pair.transfer_id)`

// duplicateQuery is intentPairsSQL over every transfer, within the window
// $2: the first $1 pairs, oldest first, with their total.
var duplicateQuery = `
SELECT *, count(*) OVER () AS total
FROM (` + fmt.Sprintf(intentPairsSQL, "transfer", "$2") + `) pair
ORDER BY created_at, transfer_id
LIMIT greatest($1::int, 1)`

// waitingQuery lists the transitions that have waited for their creation
// longer than $2: the creation was lost, dead-lettered, or never
// published. pending_transition holds only the transitions waiting now
// (the creation's transaction deletes its row), never the history: every
// pass reads all of it.
const waitingQuery = `
SELECT transfer_id, event_id, event_type, from_account, to_account, amount_minor, currency, received_at,
       count(*) OVER () AS total
FROM pending_transition
WHERE received_at < now() - $2::interval
ORDER BY received_at, transfer_id
LIMIT greatest($1::int, 1)`
