-- Each usage event says which tier the provider billed it at ('standard', 'flex', 'batch') and
-- the price it was booked at (JSON: model, tier, the price list's date and USD per million
-- tokens), so an invoice line can be reproduced from the event alone and a later price change
-- never rewrites what was booked. Events booked before this migration have neither (NULL): they
-- were priced at the standard tier (batch lines at half of it) of the built-in table.
ALTER TABLE ledger_events ADD COLUMN service_tier TEXT;
ALTER TABLE ledger_events ADD COLUMN price_booked TEXT;
-- 1: the model had no price (run with BACKFILL_ALLOW_UNPRICED): cost_nanos is 0 but the cost is
-- unknown, and every report says so instead of showing $0.
ALTER TABLE ledger_events ADD COLUMN cost_unknown SMALLINT NOT NULL DEFAULT 0;
-- Of tokens_out: reasoning tokens, where the provider reports them (billed as output).
ALTER TABLE ledger_events ADD COLUMN tokens_reasoning BIGINT NOT NULL DEFAULT 0;
ALTER TABLE usage_daily ADD COLUMN calls_cost_unknown BIGINT NOT NULL DEFAULT 0;
-- The rollup also sums cached input tokens: `usage` shows the cached share and `usage
-- --reconcile` compares it with the provider's report without reading the ledger.
ALTER TABLE usage_daily ADD COLUMN tokens_cached BIGINT NOT NULL DEFAULT 0;
UPDATE usage_daily SET tokens_cached = COALESCE((
    SELECT sum(e.tokens_cached) FROM ledger_events e
    WHERE e.type = 'usage' AND e.tenant_id = usage_daily.tenant_id
      AND e.model = usage_daily.model AND {utc_day_of_at} = usage_daily.day
), 0);
