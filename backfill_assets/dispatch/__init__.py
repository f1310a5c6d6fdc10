"""Sending work: the pipeline, the sync dispatcher, region routing and the Batch API mode."""
