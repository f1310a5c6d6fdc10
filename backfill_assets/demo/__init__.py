"""Demo corpus generator (deterministic)."""
