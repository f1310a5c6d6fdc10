"""Opt-in Dagster storage accelerators: the only package that uses Dagster's private API."""
