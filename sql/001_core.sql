-- Core schema. Portable between SQLite and PostgreSQL; {serial_pk} is the only
-- dialect-specific token (INTEGER PRIMARY KEY / BIGSERIAL PRIMARY KEY).

CREATE TABLE tenants (
    tenant_id   TEXT PRIMARY KEY,
    region      TEXT,
    billed_tokens BIGINT NOT NULL DEFAULT 0,
    created_at  TIMESTAMP NOT NULL
);

CREATE TABLE posts (
    tenant_id     TEXT NOT NULL REFERENCES tenants (tenant_id),
    post_id       TEXT NOT NULL,
    text          TEXT NOT NULL,
    content_hash  TEXT NOT NULL,
    slice         INTEGER NOT NULL,
    imported_at   TIMESTAMP NOT NULL,
    updated_at    TIMESTAMP NOT NULL,
    PRIMARY KEY (tenant_id, post_id)
);
-- Covers the work query's scan of a partition without touching post texts.
CREATE INDEX posts_by_partition ON posts (tenant_id, slice, post_id, content_hash);

-- Refused input lines: where and why, never the text.
CREATE TABLE rejected_records (
    id            {serial_pk},
    source        TEXT NOT NULL,
    line          INTEGER NOT NULL,
    reason        TEXT NOT NULL,
    tenant_given  TEXT,
    at            TIMESTAMP NOT NULL
);
CREATE UNIQUE INDEX rejected_records_once ON rejected_records (source, line);

-- Accepted labels. The key is the identity; the derivation columns let checks recompute it
-- and let the work query anti-join without hashing in SQL.
CREATE TABLE results (
    key             TEXT PRIMARY KEY,
    tenant_id       TEXT NOT NULL,
    post_id         TEXT NOT NULL,
    slice           INTEGER NOT NULL,
    content_hash    TEXT NOT NULL,
    label           TEXT NOT NULL,
    confidence      DOUBLE PRECISION NOT NULL,
    model           TEXT NOT NULL,
    prompt_version  TEXT NOT NULL,
    task_version    TEXT NOT NULL,
    run_id          TEXT NOT NULL,
    created_at      TIMESTAMP NOT NULL
);
-- One result per post text and versions; leading (tenant_id, slice) also serves partition scans
-- and the work query's anti-join.
CREATE UNIQUE INDEX results_by_post ON results
    (tenant_id, slice, post_id, content_hash, model, prompt_version, task_version);

-- Spend and call history. attempt rows carry the key's derivation so every event can be
-- traced to one tenant's post; usage/error rows point at their attempt.
CREATE TABLE ledger_events (
    id              {serial_pk},
    tenant_id       TEXT NOT NULL,
    key             TEXT NOT NULL,
    attempt_id      TEXT NOT NULL,
    attempt_no      INTEGER NOT NULL,
    type            TEXT NOT NULL CHECK (type IN ('attempt', 'usage', 'error')),
    slice           INTEGER NOT NULL,
    post_id         TEXT,
    content_hash    TEXT,
    model           TEXT NOT NULL,
    prompt_version  TEXT,
    task_version    TEXT,
    tokens_in       BIGINT NOT NULL DEFAULT 0,
    tokens_out      BIGINT NOT NULL DEFAULT 0,
    cost            DOUBLE PRECISION NOT NULL DEFAULT 0,
    request_id      TEXT,
    status          INTEGER,
    message         TEXT,
    run_id          TEXT NOT NULL,
    at              TIMESTAMP NOT NULL
);
CREATE INDEX ledger_by_partition ON ledger_events (tenant_id, slice);

-- Current terminal failure of a key (one row per key); accepted keys have none.
CREATE TABLE dead_letters (
    key             TEXT PRIMARY KEY,
    tenant_id       TEXT NOT NULL,
    post_id         TEXT NOT NULL,
    slice           INTEGER NOT NULL,
    content_hash    TEXT NOT NULL,
    model           TEXT NOT NULL,
    prompt_version  TEXT NOT NULL,
    task_version    TEXT NOT NULL,
    outcome         TEXT NOT NULL CHECK (outcome IN
                      ('schema_rejected', 'retry_exhausted', 'transport_rejected')),
    reason          TEXT NOT NULL,
    attempts        INTEGER NOT NULL,
    run_id          TEXT NOT NULL,
    at              TIMESTAMP NOT NULL
);
CREATE INDEX dead_letters_by_post ON dead_letters (tenant_id, slice, post_id, content_hash);

-- Tokens reserved against a tenant's budget and not yet settled. A holder that dies leaves
-- its row behind; rows whose heartbeat is older than the lease are ignored.
CREATE TABLE budget_reservations (
    reservation_id  TEXT PRIMARY KEY,
    tenant_id       TEXT NOT NULL,
    tokens          BIGINT NOT NULL,
    holder          TEXT NOT NULL,
    heartbeat_at    TIMESTAMP NOT NULL
);
CREATE INDEX budget_reservations_by_tenant ON budget_reservations (tenant_id);
