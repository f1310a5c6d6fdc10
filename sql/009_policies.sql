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

-- The labels applied before policy files were the built-in policy's (or a custom prompt's, with
-- the same four labels): they were written onto the posts' shadow columns, named by the code
-- version. Each becomes the applied label of policy 'default', so an upgraded store holds
-- what it held before. 'policy@d0f22620582d' is the built-in prompt's key version, which the
-- built-in policy keeps (core/policy.py, LEGACY_KEY_VERSIONS): its human version is '1'.
-- ({semicolon} is a ';' inside a literal: statements are split on ';'.)
INSERT INTO applied_labels (tenant_id, post_id, policy_id, label, rule_ids, policy_version,
                            key_version, model, result_key, content_hash, applied_at)
SELECT r.tenant_id, r.post_id, 'default', r.label, '',
       CASE WHEN r.prompt_version = 'policy@d0f22620582d' THEN '1' ELSE r.prompt_version END,
       r.prompt_version, r.model, r.key, r.content_hash, r.created_at
FROM results r
JOIN posts p ON p.tenant_id = r.tenant_id AND p.post_id = r.post_id
             AND p.content_hash = r.content_hash
WHERE p.moderation_label_shadow = r.label
  AND p.moderation_rubric_version_shadow =
      'task=' || r.task_version || '{semicolon}prompt=' || r.prompt_version || '{semicolon}model='
      || r.model;
