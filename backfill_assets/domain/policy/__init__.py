"""The moderation policy: its file, its prompt, the output gate, gold-set figures (pure)."""
