-- Gold-set evaluations (docs/policies.md, "Evaluation"). A tenant whose purpose is
-- 'evaluation' holds gold texts as posts, so they follow every rule posts follow and their
-- calls go through the same keys, ledger and dispatcher; run, launch and the partitions leave
-- it out, and an evaluation is never booked to a customer's tenant (purpose NULL).
ALTER TABLE tenants ADD COLUMN purpose TEXT;

-- One row per policy version evaluated on a gold set: the figures the gate and the
-- policy_evaluation asset read, and the whole report (figures only, never a text).
CREATE TABLE policy_evaluations (
    id                     {serial_pk},
    key_version            TEXT NOT NULL,
    identity               TEXT NOT NULL,
    policy_id              TEXT NOT NULL,
    version                TEXT NOT NULL,
    model                  TEXT NOT NULL,
    tenant_id              TEXT NOT NULL,
    gold_source            TEXT NOT NULL,
    gold_sha256            TEXT NOT NULL,
    gold_rows              INTEGER NOT NULL,
    accuracy               DOUBLE PRECISION NOT NULL,
    macro_f1               DOUBLE PRECISION NOT NULL,
    schema_rejected_share  DOUBLE PRECISION NOT NULL,
    report                 TEXT NOT NULL,
    created_at             TIMESTAMP NOT NULL
);
CREATE INDEX policy_evaluations_by_version ON policy_evaluations (key_version, model, id);
