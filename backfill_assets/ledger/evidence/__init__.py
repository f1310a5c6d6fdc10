"""What the checks and ``verify`` read from the store, and judging many partitions."""
