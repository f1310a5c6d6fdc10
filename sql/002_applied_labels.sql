-- Where applied_labels writes accepted labels. The shadow pair is written by default; the live
-- pair only once an operator switches BACKFILL_APPLY_LIVE on (the live moderator owns it until
-- then, and its shares are the label_drift check's default baseline).
ALTER TABLE posts ADD COLUMN moderation_label TEXT;
ALTER TABLE posts ADD COLUMN moderation_rubric_version TEXT;
ALTER TABLE posts ADD COLUMN moderation_label_shadow TEXT;
ALTER TABLE posts ADD COLUMN moderation_rubric_version_shadow TEXT;
