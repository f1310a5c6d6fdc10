"""Resumable, multi-tenant LLM moderation backfill on Dagster."""
