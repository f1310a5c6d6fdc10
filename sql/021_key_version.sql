-- One name per concept (docs/architecture.md, Glossary): the policy's part of every key is its
-- key version, `key_version`, as policy_versions, applied_labels, policy_evaluations and
-- sink_writes already call it. The four tables of the run path called it prompt_version, from
-- before policy files, when the prompt was the policy. Renamed in place on both stores (SQLite
-- 3.25+ and PostgreSQL rename the column and every index that names it); no row changes.
ALTER TABLE results RENAME COLUMN prompt_version TO key_version;
ALTER TABLE ledger_events RENAME COLUMN prompt_version TO key_version;
ALTER TABLE dead_letters RENAME COLUMN prompt_version TO key_version;
ALTER TABLE batch_submissions RENAME COLUMN prompt_version TO key_version;
