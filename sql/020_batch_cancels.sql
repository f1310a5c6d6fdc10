-- How long batch cancels took: from 'cancelling' to the end (usually 'cancelled'), per Batch
-- API endpoint (its base URL, any password masked) and model. OpenAI documents that a
-- cancelled batch stays 'cancelling' until its requests in flight finish, up to 10 minutes,
-- and a line may still complete and bill meanwhile, so a deadline plan's switch-over must
-- come that much before the rescue: `run --deadline` plans with the longest of the newest
-- cancels here (BACKFILL_BATCH_CANCEL_SECONDS until there are a few). One row per batch.
CREATE TABLE batch_cancels (
    batch_id   TEXT PRIMARY KEY,
    endpoint   TEXT NOT NULL,
    model      TEXT NOT NULL,
    seconds    DOUBLE PRECISION NOT NULL,
    ended_at   TIMESTAMP NOT NULL
);
CREATE INDEX batch_cancels_newest ON batch_cancels (endpoint, model, ended_at);
