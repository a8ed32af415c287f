package db

// The reconciliation's queries (adr/0007). Each returns its findings with
// their total count, at most $1 of them but at least one when there is any.

// driftQuery compares every balance with the net of its transfers. A
// creation moves amount_minor from from_account to to_account and a
// completion moves nothing; a failure gives the amount back, so a failed
// transfer nets to zero. A transition still waiting for its creation has
// moved nothing either (it is applied in the creation's transaction), so
// the transfer table alone says what every balance must be. An account
// with transfers but no balance row is drift whatever its net, since the
// creation makes the row; a balance row without transfers must be zero
// (apply_batch makes the rows of a batch's accounts before its effects,
// so a transition that waits leaves zero rows behind).
const driftQuery = `
WITH moved AS (
    SELECT from_account AS account, CASE WHEN state = 'failed' THEN 0 ELSE -amount_minor END AS delta FROM transfer
    UNION ALL
    SELECT to_account, CASE WHEN state = 'failed' THEN 0 ELSE amount_minor END FROM transfer
), net AS (
    SELECT account, sum(delta) AS expected FROM moved GROUP BY account
)
SELECT coalesce(n.account, b.account) AS account,
       coalesce(n.expected, 0)::bigint AS expected,
       b.balance_minor AS actual,
       (coalesce(b.balance_minor, 0) - coalesce(n.expected, 0))::bigint AS difference,
       count(*) OVER () AS total
FROM net n FULL JOIN balance_projection b ON b.account = n.account
WHERE b.account IS NULL OR b.balance_minor <> coalesce(n.expected, 0)
ORDER BY 1
LIMIT greatest($1::int, 1)`

// duplicateQuery finds creations that repeat the intent of the one before
// them (the same accounts, amount and currency, another transferId) within
// the window $2, among transfers that moved money: a failed one gave its
// amount back, and a retry after a failure is no duplicate. A creation a
// person dismissed (reconcile_dismissed) is not reported again.
//
// First the intents that have two creations of any state within the
// window, ordered by intent and time: a sort of the whole table, since no
// index holds the intent (an index on it cost an event's WAL far more than
// it saved this pass, adr/0012); then, for those few, the pairs among the
// transfers that did not fail. Every such pair is
// found: between two creations at most the window apart, each creation of
// the same intent follows the one before it by less.
const duplicateQuery = `
WITH candidate AS (
    SELECT DISTINCT from_account, to_account, amount_minor, currency
    FROM (SELECT from_account, to_account, amount_minor, currency,
                 created_at - lag(created_at) OVER (PARTITION BY from_account, to_account, amount_minor, currency
                                                    ORDER BY created_at) AS gap
          FROM transfer) t
    WHERE gap <= $2::interval
), pair AS (
    SELECT t.from_account, t.to_account, t.amount_minor, t.currency, t.transfer_id, t.created_at,
           lag(t.transfer_id) OVER w AS earlier_transfer_id, lag(t.created_at) OVER w AS earlier_created_at
    FROM transfer t JOIN candidate c USING (from_account, to_account, amount_minor, currency)
    WHERE t.state <> 'failed'
    WINDOW w AS (PARTITION BY t.from_account, t.to_account, t.amount_minor, t.currency ORDER BY t.created_at)
)
SELECT *, count(*) OVER () AS total
FROM pair
WHERE created_at - earlier_created_at <= $2::interval
  AND NOT EXISTS (SELECT 1 FROM reconcile_dismissed d WHERE d.transfer_id = pair.transfer_id)
ORDER BY created_at, transfer_id
LIMIT greatest($1::int, 1)`

// waitingQuery lists the transitions that have waited for their creation
// longer than $2: the creation was lost, dead-lettered, or never
// published.
const waitingQuery = `
SELECT transfer_id, event_id, event_type, from_account, to_account, amount_minor, currency, received_at,
       count(*) OVER () AS total
FROM pending_transition
WHERE received_at < now() - $2::interval
ORDER BY received_at, transfer_id
LIMIT greatest($1::int, 1)`
