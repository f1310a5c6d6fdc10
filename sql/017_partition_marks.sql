-- A partition whose labels were materialised, passed their blocking checks and were applied
-- (and written back, with a sink) at a code version. `run` skips an idle partition with a mark
-- at the current code version without asking the Dagster instance: a no-op rerun costs one
-- set-based query, not a read per tenant. A materialisation of the partition removes its mark
-- first; only the apply that follows sets it again.
CREATE TABLE partition_marks (
    tenant_id TEXT NOT NULL,
    partition INTEGER NOT NULL,
    level INTEGER NOT NULL,
    code_version TEXT NOT NULL,
    marked_at TIMESTAMP NOT NULL,
    PRIMARY KEY (tenant_id, partition)
);
