-- The write-back of applied labels into the platform's own table (BACKFILL_SINK_URL), recorded
-- per sink, tenant, stored slice and policy key version once its last batch committed there.
-- applied_through: the newest applied_labels.applied_at among the rows written; a partition
-- whose applied labels changed after it (or that has no row) is applied in the store but not
-- yet in the sink, and `verify` says so.
CREATE TABLE sink_writes (
    sink_id TEXT NOT NULL,
    tenant_id TEXT NOT NULL,
    slice INTEGER NOT NULL,
    key_version TEXT NOT NULL,
    rows_written BIGINT NOT NULL,
    applied_through TIMESTAMP,
    written_at TIMESTAMP NOT NULL,
    PRIMARY KEY (sink_id, tenant_id, slice, key_version)
);
