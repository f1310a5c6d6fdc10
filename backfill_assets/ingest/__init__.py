"""Reading archives (JSONL, gz, directories) into the store."""
