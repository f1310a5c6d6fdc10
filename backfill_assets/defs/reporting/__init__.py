"""Reporting assets: usage for invoicing, the backfill plan, the policy evaluation, the review
queue."""
