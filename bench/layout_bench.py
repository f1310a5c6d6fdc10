"""The layout's figures (docs/architecture.md, "Layout"): what a newcomer walks into.

    bench/run layout [--json]

Counts, from the source alone (nothing is run): modules per folder (the most), modules over
400 lines, the distinct internal modules the CLI imports (outside ``backfill_assets.cli``,
at the top of a module or inside a function), the lines that name Dagster's private API
(``dagster._``) outside the accelerator package, and the settings declared again: a field of a
settings group (``config/variables.py``) that a class or a function of the product outside
``config/`` declares with a literal default of its own (the simulator, a tool apart, is not
counted).
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import Counter
from pathlib import Path

from bench.common import ROOT

PACKAGE = ROOT / "backfill_assets"
LONG_MODULE = 400


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path) -> set[str]:
    """Modules of ours that ``path`` imports, anywhere in it (``from a import b`` counts
    ``a.b`` when ``a.b`` is a module, else ``a``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = _module_name(path).split(".")
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("backfill_assets"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + (1 if path.name == "__init__.py" else 0)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if not module.startswith("backfill_assets"):
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if _exists(sub) else module)
    return found


def _exists(module: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _literal(node: ast.expr | None) -> bool:
    """A value of its own: a number, string or boolean (``None``, "not given", is not one;
    a name, such as a constant of ``config/``, refers to the one declaration)."""
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "field":
        node = next((k.value for k in node.keywords if k.arg == "default"), None)
    return isinstance(node, ast.Constant) and node.value is not None


def settings_declared_again(modules: list[Path], root: Path = PACKAGE) -> list[str]:
    """A field of a class, or a parameter, named as a setting and given a literal default of
    its own: a second declaration of that setting's default (what the settings groups of
    ``config/variables.py`` declare once)."""
    from backfill_assets.config.variables import GROUPS

    names = {name for group in GROUPS.values() for name in group.model_fields}
    found = []
    for p in modules:
        if p.is_relative_to(root / "config") or p.is_relative_to(root / "providersim"):
            continue
        where = p.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if (
                        isinstance(item, ast.AnnAssign)
                        and isinstance(item.target, ast.Name)
                        and item.target.id in names
                        and _literal(item.value)
                    ):
                        found.append(f"{item.target.id} {where}:{item.lineno}")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                positional = [*a.posonlyargs, *a.args]
                pairs = list(
                    zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True)
                )
                pairs += [
                    (k, d)
                    for k, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
                    if d is not None
                ]
                for arg, default in pairs:
                    if arg.arg in names and _literal(default):
                        found.append(f"{arg.arg} {where}:{default.lineno}")
    return sorted(found)


def facts() -> dict[str, object]:
    modules = sorted(PACKAGE.rglob("*.py"))
    per_folder = Counter(p.parent.relative_to(ROOT).as_posix() for p in modules)
    folder, most = per_folder.most_common(1)[0]
    long = {
        p.relative_to(PACKAGE).as_posix(): n
        for p in modules
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > LONG_MODULE
    }
    cli = [p for p in modules if p.is_relative_to(PACKAGE / "cli")]
    cli_imports = sorted(
        {m for p in cli for m in _imported(p) if not m.startswith("backfill_assets.cli")}
    )
    private = [
        f"{p.relative_to(PACKAGE).as_posix()}:{i}"
        for p in modules
        if not p.is_relative_to(PACKAGE / "accelerators")
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if "dagster._" in line
    ]
    again = settings_declared_again(modules)
    return {
        "modules": len(modules),
        "folders": len(per_folder),
        "most_modules_in_a_folder": most,
        "most_crowded_folder": folder,
        "modules_over_400_lines": long,
        "cli_internal_imports": len(cli_imports),
        "cli_imports": cli_imports,
        "private_dagster_lines_outside_accelerators": len(private),
        "private_dagster_where": private,
        "settings_declared_again": len({a.split()[0] for a in again}),
        "settings_declared_again_where": again,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--json", action="store_true", help="one JSON document")
    a = p.parse_args()
    doc = facts()
    if a.json:
        print(json.dumps(doc))
        return
    print(f"modules: {doc['modules']} in {doc['folders']} folders")
    print(
        f"most modules in one folder: {doc['most_modules_in_a_folder']} ({doc['most_crowded_folder']})"
    )
    long = doc["modules_over_400_lines"]
    assert isinstance(long, dict)
    print(f"modules over {LONG_MODULE} lines: {len(long)}")
    for name, n in sorted(long.items(), key=lambda kv: -kv[1]):
        print(f"  {n:>5}  {name}")
    print(f"internal modules the CLI imports: {doc['cli_internal_imports']}")
    for name in doc["cli_imports"]:  # type: ignore[attr-defined]
        print(f"  {name}")
    print(
        f"lines naming dagster._ outside accelerators/: {doc['private_dagster_lines_outside_accelerators']}"
    )
    print(f"settings declared again outside config/: {doc['settings_declared_again']}")
    for where in doc["settings_declared_again_where"]:  # type: ignore[attr-defined]
        print(f"  {where}")
    print(json.dumps({k: v for k, v in doc.items() if isinstance(v, int)}))


if __name__ == "__main__":
    main()
