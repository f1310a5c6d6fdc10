"""Batch API dispatch (``BACKFILL_DISPATCH=batch``): half-price, crash-safe backfills.

Modules: ``options`` (settings), ``chunks`` (pure chunking and chunk ids), ``wire`` (JSONL and
batch objects), ``triage`` (what each output line means), ``client`` (Files/Batches over
httpx, one error taxonomy with sync: ``models.errors``), ``submit`` (plan, reserve, intent,
upload), ``attach`` (create exactly once, re-attach), ``texts`` (what a provider may quote
back, scrubbed before storing), ``booking`` (fetch and commit, every usage shape),
``runner`` (the per-run coordinator and poller), ``pacing`` (token-limit gate, poll spacing),
``mode`` (the entry point ``pipeline.run_partitions`` calls). ``cli/batch_run.py`` runs it
without Dagster.
"""
