"""Units of work: keys, records, columns, outcomes, event kinds, regions (pure)."""
