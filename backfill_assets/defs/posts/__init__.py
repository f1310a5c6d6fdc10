"""The posts asset and its incremental-import schedule."""
