"""The platform's own databases: posts read from them, labels written back."""
