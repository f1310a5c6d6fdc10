-- People in the loop (issue 50, docs/data.md "Decisions in"). A moderator's decision about a
-- post under a policy version; never a name or an email: reviewer_id is opaque. decision_key
-- is the decision's identity (tenant, post, policy id, reviewer, decided_at) hashed, so a
-- re-import finds it; content_hash is the post's text the decision was imported against (an
-- edited post's new text is the model's again). rule_ids: comma-joined, '' for none, as in
-- results.
CREATE TABLE decisions (
    decision_key    TEXT PRIMARY KEY,
    tenant_id       TEXT NOT NULL,
    post_id         TEXT NOT NULL,
    policy_id       TEXT NOT NULL,
    policy_version  TEXT NOT NULL,
    key_version     TEXT NOT NULL,
    label           TEXT NOT NULL,
    rule_ids        TEXT NOT NULL,
    reviewer_id     TEXT NOT NULL,
    decided_at      TIMESTAMP NOT NULL,
    reason_code     TEXT,
    content_hash    TEXT NOT NULL,
    imported_at     TIMESTAMP NOT NULL
);
CREATE INDEX decisions_by_post ON decisions (tenant_id, post_id, policy_id, decided_at);

-- Whose label applied_labels holds: 'model' (a result's, result_key names it) or 'human' (a
-- decision's, result_key is its decision_key). No model apply replaces a 'human' row unless
-- the decision's label or a rule no longer exists in the version applied, or the post's text
-- changed (ledger/decisions/precedence.py).
ALTER TABLE applied_labels ADD COLUMN source TEXT NOT NULL DEFAULT 'model';

-- A previous classifier's results per post (`baseline import --name NAME`), mapped onto the
-- policy's labels at import; scores: the attribute scores as given (JSON), NULL when the
-- baseline gave a label. Never applied: only `evaluate --against-baseline` reads it.
CREATE TABLE baselines (
    name            TEXT NOT NULL,
    tenant_id       TEXT NOT NULL,
    post_id         TEXT NOT NULL,
    policy_id       TEXT NOT NULL,
    label           TEXT NOT NULL,
    scores          TEXT,
    content_hash    TEXT NOT NULL,
    imported_at     TIMESTAMP NOT NULL,
    PRIMARY KEY (name, tenant_id, post_id)
);

-- The decisions in force, read by every model apply (ledger/decisions/precedence.py): a few
-- among a tenant's labels, found without reading the rest.
CREATE INDEX applied_labels_human ON applied_labels (tenant_id, policy_id) WHERE source = 'human';
