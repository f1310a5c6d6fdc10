-- Where `evaluate --report DIR` wrote an evaluation's pictures and calibration.json (NULL: no
-- report was written). Set once the files are there; the policy_evaluation asset links them
-- (docs/policies.md, "Calibration").
ALTER TABLE policy_evaluations ADD COLUMN report_dir TEXT;
