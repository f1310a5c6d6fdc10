"""The ``settings`` resource's fields are declared once, on ``RunSettings``: the environment
reads each from its variable with the resource's default and bounds, and hands every one on."""

from __future__ import annotations

from pathlib import Path

import pytest

from backfill_assets.config.settings import Settings, SettingsError
from backfill_assets.defs.resources import RunSettings

# A valid value other than the default for every field (dispatch: batch needs a Batch API).
CHANGED = {
    "concurrency": ("BACKFILL_CONCURRENCY", "9", 9),
    "tenant_budget_tokens": ("BACKFILL_TENANT_BUDGET_TOKENS", "1000", 1000),
    "max_attempts": ("BACKFILL_MAX_ATTEMPTS", "6", 6),
    "retry_base_seconds": ("BACKFILL_RETRY_BASE_SECONDS", "0.25", 0.25),
    "retry_max_seconds": ("BACKFILL_RETRY_MAX_SECONDS", "12", 12.0),
    "retry_after_max_seconds": ("BACKFILL_RETRY_AFTER_MAX_SECONDS", "60", 60.0),
    "flush_ms": ("BACKFILL_FLUSH_MS", "50", 50.0),
    "slice_target_posts": ("BACKFILL_SLICE_TARGET_POSTS", "700", 700),
    "batch_max_lines": ("BACKFILL_BATCH_MAX_LINES", "100", 100),
    "batch_max_output_bytes": ("BACKFILL_BATCH_MAX_OUTPUT_BYTES", "4096", 4096),
    "batch_poll_seconds": ("BACKFILL_BATCH_POLL_SECONDS", "5", 5.0),
    "batch_create_lookup_seconds": ("BACKFILL_BATCH_CREATE_LOOKUP_SECONDS", "30", 30.0),
}


def test_every_run_setting_is_read_once_and_handed_on(tmp_path: Path) -> None:
    env = {var: raw for var, raw, _v in CHANGED.values()}
    env["BACKFILL_IMPORT_DIR"] = str(tmp_path)
    got = Settings.from_env(env).run_settings()
    assert {**{k: v for k, (_e, _r, v) in CHANGED.items()}, "import_dir": str(tmp_path)} == {
        k: getattr(got, k) for k in RunSettings.model_fields if k != "dispatch"
    }
    assert set(CHANGED) | {"import_dir", "dispatch"} == set(RunSettings.model_fields)
    assert Settings.from_env({}).run_settings() == RunSettings()


@pytest.mark.parametrize(
    ("var", "raw"),
    [("BACKFILL_CONCURRENCY", "0"), ("BACKFILL_FLUSH_MS", "5000"), ("BACKFILL_DISPATCH", "x")],
)
def test_the_resources_bounds_refuse_a_variable_by_name(var: str, raw: str) -> None:
    with pytest.raises(SettingsError, match=var):
        Settings.from_env({var: raw})
