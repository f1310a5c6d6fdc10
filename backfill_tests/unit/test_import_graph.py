"""The package's imports flow one way, and the simulator stays outside the product.

Every import counts, also those inside functions and under ``TYPE_CHECKING``: a cycle held
together by type hints still says two modules know each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import backfill_assets

PACKAGE = Path(backfill_assets.__file__).parent
SIMULATOR = "backfill_assets.providersim"
# The one product module that may import the simulator: the command that launches it.
SIMULATOR_LAUNCHER = "backfill_assets.cli.provider_sim"


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["backfill_assets", *path.relative_to(PACKAGE).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _imports(modules: dict[str, tuple[Path, bool]]) -> dict[str, set[str]]:
    """Module -> the package modules it imports (a ``from x import y`` of a module is y)."""
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            found: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    here = here[: len(here) - (node.level - 1)]
                    base = ".".join([*here, *([node.module] if node.module else [])])
                found = [f"{base}.{a.name}" for a in node.names] + [base]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            for target in found:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    assert _cycles(_imports(_modules())) == []


def test_only_the_provider_sim_command_imports_the_simulator() -> None:
    graph = _imports(_modules())
    importers = sorted(
        name
        for name, targets in graph.items()
        if not name.startswith(SIMULATOR) and any(t.startswith(SIMULATOR) for t in targets)
    )
    assert importers == [SIMULATOR_LAUNCHER]


# docs/architecture.md, "Reading the code": bottom-up; a layer imports only layers below it.
LAYERS = ("core", "providers", "audit", "store", "ingest", "dispatch", "orchestration", "cli")


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_layers_import_only_downwards() -> None:
    upward = sorted(
        f"{name} -> {target}"
        for name, targets in _imports(_modules()).items()
        if (own := _layer(name)) is not None
        for target in targets
        if (theirs := _layer(target)) is not None and theirs > own
    )
    assert upward == []
