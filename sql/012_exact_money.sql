-- Money is integer nano-dollars (1e-9 USD), never a float: a sum over millions of calls is
-- exact and the same in any order (core/money.py). The float columns are converted, rounded
-- once, and dropped.
ALTER TABLE ledger_events ADD COLUMN cost_nanos BIGINT NOT NULL DEFAULT 0;
UPDATE ledger_events SET cost_nanos = CAST(ROUND(cost * 1000000000) AS BIGINT) WHERE cost <> 0;
ALTER TABLE ledger_events DROP COLUMN cost;
ALTER TABLE usage_daily ADD COLUMN cost_nanos BIGINT NOT NULL DEFAULT 0;
UPDATE usage_daily SET cost_nanos = CAST(ROUND(cost * 1000000000) AS BIGINT) WHERE cost <> 0;
ALTER TABLE usage_daily DROP COLUMN cost;
