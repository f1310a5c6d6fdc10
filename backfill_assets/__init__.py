"""Resumable, multi-tenant LLM moderation backfill on Dagster."""


def __getattr__(name: str) -> str:
    """``__version__``, read from the installed distribution when first asked for: reading
    it costs every process ~25 ms of start-up, and only the HTTP clients' User-Agent uses it."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("backfill-moderation")
    except PackageNotFoundError:  # imported from a tree that was never installed
        found = "0+unknown"
    globals()["__version__"] = found
    return found
