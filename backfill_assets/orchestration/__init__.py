"""Module paths that Dagster homes written before the layout of 2026-12-07 still name.

An instance's ``dagster.yaml`` names its classes by module, and a home keeps the file it was
given: ``bin/dev`` and ``bin/prod`` rewrite theirs at every start, but a home made by the CLI,
or a deployment's own ``dagster.yaml``, may still say ``backfill_assets.orchestration.*``.
Each module here gives the same class from where it lives now (``backfill_assets.accelerators``);
update the file to those paths, as the templates name them.
"""
