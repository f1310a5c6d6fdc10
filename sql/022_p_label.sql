-- The probability of the chosen label where the wire gives one (issue 48): Llama Guard's
-- assessment token, a chat model's label tokens (logprobs), the moderation endpoint's deciding
-- category score. NULL where nothing gave one: never an invented number. `confidence` stays
-- what the model said about itself.
ALTER TABLE results ADD COLUMN p_label DOUBLE PRECISION;
