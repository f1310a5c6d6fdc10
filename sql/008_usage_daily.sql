-- Usage per tenant, model and UTC day (issue 10: cost follows the work). The ledger stays the
-- record; this rollup is kept in the same transaction as the usage events it sums (the
-- writer's outcome flush), so it always equals the ledger's usage events grouped by tenant,
-- model and day, and `verify` proves it. Reports (`usage`, tenant_usage, `tenant list`) read
-- it: a refresh after a small run no longer aggregates a ledger of millions of rows.
CREATE TABLE usage_daily (
    tenant_id   TEXT NOT NULL,
    model       TEXT NOT NULL,
    day         TEXT NOT NULL,
    calls       BIGINT NOT NULL,
    tokens_in   BIGINT NOT NULL,
    tokens_out  BIGINT NOT NULL,
    cost        DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant_id, model, day)
);
-- The usage booked before this migration.
INSERT INTO usage_daily (tenant_id, model, day, calls, tokens_in, tokens_out, cost)
SELECT tenant_id, model, {utc_day_of_at}, count(*), sum(tokens_in), sum(tokens_out), sum(cost)
FROM ledger_events
WHERE type = 'usage'
GROUP BY tenant_id, model, {utc_day_of_at};
