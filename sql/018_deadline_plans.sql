-- A deadline plan being carried out (`run --deadline`). The deadline and the switch-over are
-- stored with the plan, so a run resumed after a crash follows the same plan and the same
-- deadline instead of reading a new one from a clock offset ("36h" from now). At most one
-- plan is open (finished_at NULL) per code version; plan_json is the plan as printed.
-- flex_calls and flex_refused count the flex requests sent and those refused for capacity:
-- the history later plans take flex unavailability from, per model.
CREATE TABLE deadline_plans (
    plan_id       TEXT PRIMARY KEY,
    code_version  TEXT NOT NULL,
    model         TEXT NOT NULL,
    created_at    TIMESTAMP NOT NULL,
    deadline      TIMESTAMP NOT NULL,
    switch_over   TIMESTAMP,
    plan_json     TEXT NOT NULL,
    submitted_at  TIMESTAMP,
    switched_at   TIMESTAMP,
    finished_at   TIMESTAMP,
    flex_calls    BIGINT NOT NULL DEFAULT 0,
    flex_refused  BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX deadline_plans_open ON deadline_plans (code_version, finished_at);
