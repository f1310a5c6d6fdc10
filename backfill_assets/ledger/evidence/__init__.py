"""What the checks and ``verify`` read from the store, and checking many partitions."""
