"""The rules the asset checks and `verify` apply (pure over evidence read from the store)."""
