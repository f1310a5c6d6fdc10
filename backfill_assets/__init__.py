"""Resumable, multi-tenant LLM moderation backfill on Dagster."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("backfill-moderation")
except PackageNotFoundError:  # imported from a tree that was never installed
    __version__ = "0+unknown"
