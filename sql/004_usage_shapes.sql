-- What a usage event's figures rest on (issue 9). Providers report usage in several shapes:
--   usage_shape = 'split'   prompt and completion tokens given (tokens_in / tokens_out);
--                 'total'   only the total is known: booked in tokens_in, tokens_out = 0;
--                 'missing' a 2xx with no usage at all: booked at the call's bound, never 0.
-- bound_tokens is the upper bound reserved for the call before it was sent; a usage event
-- whose tokens exceed it means the provider billed past any byte-level tokenizer's count.
ALTER TABLE ledger_events ADD COLUMN usage_shape TEXT;
ALTER TABLE ledger_events ADD COLUMN bound_tokens BIGINT;
