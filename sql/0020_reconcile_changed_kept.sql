-- Transfers changed since the checkpoint are a finding kept until a person
-- resolves it (adr/0007, "Changed since the checkpoint: kept until a
-- person resolves it").
--
-- A full pass that compares the transfers with the checkpoint finds the
-- accounts whose transfers no longer sum to what it says: a transfer it
-- counted was changed or deleted behind the service's back, history
-- edited. Until this migration the pass logged them, then made the
-- checkpoint anew from the transfers as they are now, and no later pass
-- could find the change again: the one finding that says someone edited
-- history vanished by itself. Now the pass writes each into
-- reconcile_finding (kind changed; subject the account and the time the
-- checkpoint it differs from was made, so that a second edit found
-- against a later checkpoint is a finding of its own), in the transaction
-- that makes the checkpoint anew, and no pass deletes it: every pass
-- reports it until a row of reconcile_resolved names it.
--
-- A person resolves one after looking into it, with why; the row keeps
-- who and when, and the finding stays in reconcile_finding as it was
-- found, for an audit. The foreign key refuses a resolution that names no
-- finding (a subject mistyped), and the deletion of a finding a
-- resolution names. Only people write reconcile_resolved; the service
-- only reads it. Written to run again harmlessly.

ALTER TABLE reconcile_finding DROP CONSTRAINT IF EXISTS reconcile_finding_kind_check;
ALTER TABLE reconcile_finding ADD CONSTRAINT reconcile_finding_kind_check
    CHECK (kind IN ('drift', 'duplicate', 'waiting', 'changed'));

CREATE TABLE IF NOT EXISTS reconcile_resolved (
    kind        TEXT        NOT NULL CHECK (kind = 'changed'),
    subject     TEXT        NOT NULL,
    note        TEXT        NOT NULL CHECK (note <> ''),
    resolved_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    resolved_by TEXT        NOT NULL DEFAULT current_user,
    PRIMARY KEY (kind, subject),
    FOREIGN KEY (kind, subject) REFERENCES reconcile_finding (kind, subject)
);
