-- Prompt-cache usage of each call, booked beside its tokens: of tokens_in, how many were read
-- from the provider's cache (billed cheaper) and written to it (Anthropic-shaped usage, billed
-- dearer). The cost booked with the event already prices them; these say why.
ALTER TABLE ledger_events ADD COLUMN tokens_cached BIGINT NOT NULL DEFAULT 0;
ALTER TABLE ledger_events ADD COLUMN tokens_cache_written BIGINT NOT NULL DEFAULT 0;
