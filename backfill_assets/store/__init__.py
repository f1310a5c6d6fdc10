"""All SQL: engines, migrations, the work query, the writer, locks, the ledger and reports."""
