-- Budgets in dollars beside budgets in tokens, each strict by reservation.
-- tenants.budget_tokens / budget_nanos: the tenant's caps (`tenant set-budget`); NULL: none
--   (for tokens, BACKFILL_TENANT_BUDGET_TOKENS then applies to every tenant).
-- tenants.billed_nanos: what the tenant's usage events cost, moved there from its reservation
--   in the same transaction as the events (as billed_tokens is); filled from the ledger here.
-- budget_reservations.nanos, batch_submissions.reserved_nanos, batch_lines.bound_nanos: the
--   dollar half of a reservation, in nano-dollars, held and released exactly as tokens are.
ALTER TABLE tenants ADD COLUMN budget_tokens BIGINT;
ALTER TABLE tenants ADD COLUMN budget_nanos BIGINT;
ALTER TABLE tenants ADD COLUMN billed_nanos BIGINT NOT NULL DEFAULT 0;
UPDATE tenants SET billed_nanos = COALESCE((
    SELECT sum(d.cost_nanos) FROM usage_daily d WHERE d.tenant_id = tenants.tenant_id
), 0);
ALTER TABLE budget_reservations ADD COLUMN nanos BIGINT NOT NULL DEFAULT 0;
ALTER TABLE batch_submissions ADD COLUMN reserved_nanos BIGINT NOT NULL DEFAULT 0;
ALTER TABLE batch_lines ADD COLUMN bound_nanos BIGINT;
