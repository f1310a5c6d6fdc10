-- The stage of a cascade (issue 49) that decided a label: on the rows of a cascade's labels
-- (model `cascade`), which the run composes from its stages' own results (each under its own
-- key version, answer and ledger). NULL on every other result.
ALTER TABLE results ADD COLUMN stage TEXT;
