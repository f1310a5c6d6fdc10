-- Processes that share one provider account's rate limit (issue 11). A member is one process
-- using one endpoint (base URL, model and a hash of the API key, never the key). Its share of
-- the configured RPM/TPM is weight / sum(weight) over the live members, where weight is the
-- number of tenants it is sending for (fair share per tenant, not per process). Heartbeats
-- are the database's clock, so hosts with skewed clocks agree; a member that stops (SIGKILL)
-- is dropped by the next heartbeat of any other member after a few seconds.
CREATE TABLE limiter_members (
    endpoint      TEXT NOT NULL,
    member        TEXT NOT NULL,
    weight        DOUBLE PRECISION NOT NULL,
    heartbeat_at  DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (endpoint, member)
);
