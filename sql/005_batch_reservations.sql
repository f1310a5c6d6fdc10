-- Batch mode's money path (issue 9).
-- batch_lines.bound_tokens: the most tokens the line's request can bill (rubric.call_token_bound
--   of the text it was sent with), fixed at intent. A chunk reserves the sum of its lines'
--   bounds; a line reported without usage is booked at its bound; one billed past it stops the
--   tenant. Stored, not recomputed: the post may be edited and the prompt changed since.
-- batch_submissions.reserved_tokens now holds the chunk's live reservation: granted with the
--   intent (in its transaction, under the tenant's budget lock), decreased by each line's bound
--   when the line's usage or error event commits, and no longer counted once the chunk leaves
--   the open states. No lease: it holds while the batch can bill, whoever is alive.
-- batch_submissions.create_sent_at: a create was sent and its outcome may be unknown; until
--   the batch is found by its metadata or the lookup window has passed, no second create.
-- batch_lines_by_post: the work query leaves keys in open chunks to their batch.
ALTER TABLE batch_lines ADD COLUMN bound_tokens BIGINT;
ALTER TABLE batch_submissions ADD COLUMN create_sent_at TIMESTAMP;
CREATE INDEX batch_lines_by_post ON batch_lines (tenant_id, post_id);
