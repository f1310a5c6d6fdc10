"""Export files in (JSONL, CSV, Parquet, gzip, directories): one reader per format, for
imports and gold sets alike."""
