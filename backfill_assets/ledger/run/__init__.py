"""The run path in the store: posts, the work query, the writer, usage, partition marks."""
