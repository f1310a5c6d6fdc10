"""The commands of ``backfill-moderation``: each parses its arguments, calls one API and prints."""
