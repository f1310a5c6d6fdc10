-- Policy files (docs/policies.md). Every accepted label names the rules that matched (comma-
-- joined ids; '' for none, as every result stored before policy files has). policy_versions
-- holds each policy version this store worked under, with its canonical content, so an old
-- version's results can still be judged by its own labels and rules. applied_labels is the
-- label in force per (tenant, post, policy id): the newest version's, whatever order the runs
-- finish in.
ALTER TABLE results ADD COLUMN rule_ids TEXT NOT NULL DEFAULT '';

CREATE TABLE policy_versions (
    key_version    TEXT PRIMARY KEY,
    policy_id      TEXT NOT NULL,
    version        TEXT NOT NULL,
    identity       TEXT NOT NULL,
    content_hash   TEXT NOT NULL,
    document       TEXT NOT NULL,
    registered_at  TIMESTAMP NOT NULL
);
CREATE INDEX policy_versions_by_policy ON policy_versions (policy_id);

CREATE TABLE applied_labels (
    tenant_id       TEXT NOT NULL,
    post_id         TEXT NOT NULL,
    policy_id       TEXT NOT NULL,
    label           TEXT NOT NULL,
    rule_ids        TEXT NOT NULL,
    policy_version  TEXT NOT NULL,
    key_version     TEXT NOT NULL,
    model           TEXT NOT NULL,
    result_key      TEXT NOT NULL,
    content_hash    TEXT NOT NULL,
    applied_at      TIMESTAMP NOT NULL,
    PRIMARY KEY (tenant_id, post_id, policy_id)
);
