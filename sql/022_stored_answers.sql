-- What a result keeps of its call (issue 48).
-- p_label: the probability of the chosen label where the wire gives one (Llama Guard's
-- assessment token, a chat model's label tokens, the moderation endpoint's deciding score);
-- NULL where nothing gave one, never an invented number. `confidence` stays what the model said
-- about itself.
-- raw_result and mapping: in a dialect whose answer is mapped onto the policy by its
-- `dialects:` section (openai-moderation; llama-guard with the built-in categories), the answer
-- as the call returned it and the section's hash it was read under, so a changed threshold or
-- category re-labels from the stored answer without a call. NULL in other dialects.
ALTER TABLE results ADD COLUMN p_label DOUBLE PRECISION;
ALTER TABLE results ADD COLUMN raw_result TEXT;
ALTER TABLE results ADD COLUMN mapping TEXT;
