"""Names vulture cannot see used; reviewed. ``bin/test`` runs vulture with this file.

Vulture matches by name, so each entry keeps that name alive everywhere: list a name only
when a framework or a test calls it, and say which. Not imported or executed by anything.
"""
# ruff: noqa

# pydantic: model_config is read by the metaclass; validators are called on validation.
model_config
_regions_well_formed  # resources.OpenAIModelResource
_json_number  # rubric
_no_negative_zero  # rubric
_prices_parse  # settings.Settings
_model_url_plain  # settings.Settings
_database_url_parses  # settings.Settings
_platform_url_parses  # settings.Settings
drivername  # urls.UrlParts: compared with make_url's by domain/test_urls.py
_prompt_path_replaced  # settings.Settings
prompt_path  # settings.Settings: BACKFILL_PROMPT_PATH, read only to refuse it
_batch_needs_a_batch_api  # settings.Settings
_model_is_priced  # settings.Settings
_import_dir_absolute  # settings.Settings
_json_array  # rubric
_texts  # policy.Examples
_description  # policy.LabelDef, policy.RuleDef
_severity  # policy.LabelDef
_id  # policy.LabelDef, policy.RuleDef
_policy_id  # policy.PolicyDoc
_version  # policy.PolicyDoc
_instructions  # policy.PolicyDoc
_cron_parses  # settings.Settings
_kill_point_known  # settings.Settings
_source_is_whole  # settings.Settings
_sink_table_is_a_name  # settings.Settings

# pydantic-settings calls these hooks with these keyword names (settings.Settings).
settings_customise_sources
env_settings
dotenv_settings
file_secret_settings
_load_env_vars  # settings._MappingSource

# pandera: DataFrameModel checks, its inner Config class and its fields (validation.py).
Config
correlation_matches
strict
coerce

# dagster: IOManager hooks (defs/sealing.py).
handle_output
load_input

# rich: ProgressColumn.render is called by rich (cli/progress.py); Column.justify (cli/tables.py).
render
justify

# __exit__(exc_type, exc, tb): the context-manager protocol's signature.
exc_type
tb

# SQLAlchemy event listeners registered by decorator, and pysqlite's isolation_level
# (ledger/engine.py).
_on_connect
_on_begin
isolation_level

# store.submissions.Submission mirrors batch_submissions columns (filled from the row).
file_bytes
requests_completed
requests_failed
finished_at
booked_at

# Used by the tests only (vulture does not scan backfill_tests):
parse_line  # records: one JSONL line to a post or a rejection, what the record tests drive
materialize  # orchestrate: the in-process runner the Dagster tests drive
refresh  # ratelimit.shared: heartbeat now (test_shared_limit)
retry_after_capped  # dispatch.PartitionStats: asserted by the Retry-After tests
usage_reported  # models.base.ModelResponse: asserted by test_adapter_sim
billed_batch_tokens  # providersim.meter: the batch tests' bill

# bench.fuzz_bench.FuzzResult: printed through dataclasses.asdict (the --json line).
billed_calls
keys_billed
batch_lines_billed
batch_creates
rebilled_tokens_ledger
kills_by_moment
cycles_finished_unkilled
lost_total
lost_max_per_kill
bound_per_kill
within_bound

# pyproject.toml's [project.scripts]: the installed `backfill-moderation` command.
console_script

# Dagster: loads EmbeddedInstance from dagster.yaml (instance_class) and calls its config hooks;
# storages are built by from_config_value and connect through _connect (sqlite_instance.py).
EmbeddedInstance
config_schema
from_config_value
_connect
_event_log_storage
capture_logs  # a compute log manager's hook, called by Dagster's executor (compute_logs.py)
_run_storage  # pg_instance.py: replaces the stock run storage as _event_log_storage does
row_factory  # sqlite3: a cursor attribute the driver reads (ledger/bulk.py)

# Tests close a store's engines before dropping its database (conftest.dispose_engine).
dispose_engine  # resources

# Export columns, read by name (asdict, getattr) in cli/commands/export.py.
policy_identity
labelled_at

# Settings field read by its variable name before validation (_read_prices_file).
prices_path

# Used by the test that the page has a table for every section.
sections_on

# Read by the test that the event log keeps its open shards bounded.
open_engines
_store_asset_check_evaluation_planned  # sqlite_instance: Dagster's SqlEventLogStorage calls the override

# Python: a module-level __getattr__ answers a name the module does not hold (PEP 562).
__getattr__  # backfill_assets/__init__.py: __version__, read when first asked for
cmd_run  # cli/__init__.py: lazy("run:cmd_run"), imported when `run` is chosen

# A module attribute of Dagster's daemon controller, set so the backfill daemon ticks sooner.
DEFAULT_DAEMON_INTERVAL_SECONDS  # accelerators/instance_class.py: read by Dagster's daemon
