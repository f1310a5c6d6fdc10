"""Our own store (the ledger): engine, migrations, tables, locks, the run path, spend and the
checks' evidence. The platform's own databases are ``platform_db``."""
