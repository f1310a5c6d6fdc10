"""Resources as the webserver sees them: no config, so run config cannot redirect anything.

A ``ConfigurableResource`` bound in ``Definitions`` turns every field into run config, and
run config given at launch (the launchpad, GraphQL ``launchRun``) overrides the bound value:
anyone who can reach the unauthenticated webserver could point the model at another host
with the real key, or the store elsewhere. Its bound values also become defaults of the job's
config schema, which Dagster stores in every run snapshot and serves over GraphQL.

So each resource is wrapped in a definition whose config schema is an empty strict shape.
Dagster refuses any ``resources.<name>.config`` entry at launch, naming it, before a run
exists. The values come from the ``Settings`` the code location was loaded with, i.e. from
the environment of the process that runs the step (a run worker loads the definitions itself).

Ops are sealed the same way. An op without a config schema takes ``Any`` config, stored with
the run; a field typed ``str`` in a ``dg.Config`` class is a ``StringSource``, which resolves
``{"env": "NAME"}`` in the run worker, so a launch could read any variable of the worker's
environment. Every op here takes ``NO_CONFIG``, or plain ``dg.String`` fields built with
``launch_field``, which accept literal values only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

# The default IO manager's name. Its default (``fs_io_manager``) takes a ``base_dir`` from run
# config, a directory chosen from the UI that a step would write into. No asset here returns a
# value, so nothing is ever stored; the sealed one keeps that path closed anyway.
IO_MANAGER = "io_manager"

# An op's config schema when it takes none: a strict empty shape, so config a launch sends for
# it is refused at launch, naming it, instead of being stored with the run and ignored.
NO_CONFIG: dict[str, Any] = {}


def launch_field(default: str, description: str) -> dg.Field:
    """A config field a launch may set: a literal string, never a source (``{"env": ...}``)."""
    return dg.Field(dg.String, default_value=default, is_required=False, description=description)


def seal(resource: Any, description: str | None = None) -> dg.ResourceDefinition:
    """``resource`` itself to every step, with no config a launch could set."""
    return dg.ResourceDefinition(
        resource_fn=lambda _context: resource,
        config_schema={},
        description=description or (type(resource).__doc__ or "").strip().splitlines()[0],
    )


class _NoValues(dg.IOManager):
    """Assets here return ``MaterializeResult``: a stored or loaded value is a wiring bug."""

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        """Outputs are ``None`` (``Nothing``); anything else is refused, not written."""
        if obj is not None:
            raise dg.Failure(f"{context.asset_key}: an output value was returned; none is stored")

    def load_input(self, context: dg.InputContext) -> object:
        """Nothing is stored, so nothing is loaded."""
        raise dg.Failure(f"{context.asset_key}: no stored value to load")


def sealed_io_manager() -> dg.IOManagerDefinition:
    """The IO manager: stores nothing and takes no config."""
    return dg.IOManagerDefinition(
        resource_fn=lambda _context: _NoValues(),
        config_schema={},
        description="Stores nothing: every asset reports a MaterializeResult.",
    )


def sealed_resources(resources: Mapping[str, Any]) -> dict[str, Any]:
    """Every resource sealed, plus the IO manager."""
    out: dict[str, Any] = {name: seal(r) for name, r in resources.items()}
    out[IO_MANAGER] = sealed_io_manager()
    return out
