-- Batch API submissions (BACKFILL_DISPATCH=batch). One row per chunk: a batch file holding
-- some of one partition's keys. The row and its lines are written (with each line's attempt
-- event) before the file is uploaded, and the provider's file and batch ids are stored the
-- moment they are returned, so a run that dies at any step re-attaches instead of paying twice.
-- chunk_id = chunk_base (sha256 of versions, tenant, slice and sorted keys) + seq, where seq
-- counts earlier chunks with the same keys (a resubmission after a token-limit failure).
CREATE TABLE batch_submissions (
    chunk_id            TEXT NOT NULL PRIMARY KEY,
    chunk_base          TEXT NOT NULL,
    seq                 INTEGER NOT NULL,
    tenant_id           TEXT NOT NULL,
    slice               INTEGER NOT NULL,
    model               TEXT NOT NULL,
    prompt_version      TEXT NOT NULL,
    task_version        TEXT NOT NULL,
    lines               INTEGER NOT NULL,
    file_sha256         TEXT NOT NULL,
    file_bytes          BIGINT NOT NULL,
    file_id             TEXT,
    batch_id            TEXT,
    state               TEXT NOT NULL CHECK (state IN ('intent', 'uploaded', 'submitted',
                          'ended', 'applied', 'failed', 'requeued', 'abandoned')),
    provider_status     TEXT,
    output_file_id      TEXT,
    error_file_id       TEXT,
    requests_total      INTEGER NOT NULL DEFAULT 0,
    requests_completed  INTEGER NOT NULL DEFAULT 0,
    requests_failed     INTEGER NOT NULL DEFAULT 0,
    reserved_tokens     BIGINT NOT NULL DEFAULT 0,
    errors              TEXT,
    run_id              TEXT NOT NULL,
    intent_at           TIMESTAMP NOT NULL,
    submitted_at        TIMESTAMP,
    finished_at         TIMESTAMP,
    applied_at          TIMESTAMP
);
CREATE UNIQUE INDEX batch_submissions_by_base ON batch_submissions (chunk_base, seq);
-- Resume looks up a partition's open submissions.
CREATE INDEX batch_submissions_by_partition ON batch_submissions (tenant_id, slice, state);
CREATE UNIQUE INDEX batch_submissions_by_batch ON batch_submissions (batch_id);

-- The keys of a chunk, one per batch line (custom_id = key). Ids and hashes only, never text.
CREATE TABLE batch_lines (
    chunk_id        TEXT NOT NULL REFERENCES batch_submissions (chunk_id),
    line_no         INTEGER NOT NULL,
    key             TEXT NOT NULL,
    tenant_id       TEXT NOT NULL,
    slice           INTEGER NOT NULL,
    post_id         TEXT NOT NULL,
    content_hash    TEXT NOT NULL,
    attempt_no      INTEGER NOT NULL,
    PRIMARY KEY (chunk_id, line_no)
);
CREATE UNIQUE INDEX batch_lines_custom_id ON batch_lines (chunk_id, key);
-- Attempt numbers: how often a partition's keys were sent in earlier chunks.
CREATE INDEX batch_lines_by_partition ON batch_lines (tenant_id, slice, key);
