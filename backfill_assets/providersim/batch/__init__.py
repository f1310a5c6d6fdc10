"""The simulator's Files and Batch APIs."""
