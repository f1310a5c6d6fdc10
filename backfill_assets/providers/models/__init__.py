"""Model adapters: one interface, a deterministic fake and HTTP providers."""
