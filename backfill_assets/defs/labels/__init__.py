"""The moderation labels asset, its checks and the apply."""
