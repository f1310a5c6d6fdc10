"""``policy check FILE`` and ``policy diff A B``: a moderation policy before it costs anything."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from backfill_assets.cli.parsers import command_group
from backfill_assets.cli.tables import emit, table, tell
from backfill_assets.domain.policy import (
    GUARD_CODES,
    LLAMA_GUARD_CATEGORIES,
    Policy,
    PolicyInvalid,
    Rubric,
    diff_policies,
    load_policy,
)

if TYPE_CHECKING:
    from backfill_assets.config.settings import Settings

# Exit status of a policy file with problems (bad input, as everywhere in the CLI).
INVALID = 2


def add_policy_commands(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Register the ``policy`` group: ``check`` and ``diff``."""
    child = command_group(
        add, "policy", "Moderation policy files: check one, diff two.", "policy_command"
    )

    sp = child(
        "check",
        "Check a policy file: id, version, identity, labels, rules and the prompt prefix's "
        "token estimate; exit 2 listing every problem with its line and column.",
    )
    sp.add_argument("file", help="the policy file (YAML)")
    sp.set_defaults(func=cmd_policy_check)

    sp = child("diff", "Labels and rules added, removed or changed from policy A to policy B.")
    sp.add_argument("a", metavar="A", help="the policy file before")
    sp.add_argument("b", metavar="B", help="the policy file after")
    sp.set_defaults(func=cmd_policy_diff)


def _load(args: argparse.Namespace, path: str) -> Policy | None:
    """The policy, or None after printing its problems (stdout: they are the answer)."""
    try:
        return load_policy(path)
    except PolicyInvalid as exc:
        problems = [
            {"file": path, "line": p.line, "column": p.column, "message": p.message}
            for p in exc.problems
        ]
        lines = [p.render(path) for p in exc.problems]
        emit(args, {"ok": False, "file": path, "problems": problems}, *lines)
        tell(f"backfill-moderation policy {args.policy_command}: {len(lines)} problem(s) in {path}")
        return None


def describe(policy: Policy) -> dict[str, Any]:
    """A policy's identity and contents, as ``check --json`` prints them."""
    rubric = Rubric(policy)
    doc = policy.doc
    return {
        "id": policy.policy_id,
        "version": policy.version,
        "identity": policy.identity,
        "key_version": policy.key_version,
        "content_hash": policy.content_hash,
        "none_label": policy.none_label,
        "labels": [
            {
                "id": label.id,
                "action": label.action,
                "severity": label.severity,
                "rules": len(rubric.contract.rules_of(label.id)),
            }
            for label in doc.labels
        ],
        "rules": [
            {
                "id": rule.id,
                "label": rule.label,
                "violates": len(rule.examples.violates),
                "safe": len(rule.examples.safe),
            }
            for rule in doc.rules
        ],
        "prefix_tokens_estimate": rubric.prefix_token_estimate(),
        "prefix_bytes": len(rubric.system_prompt.encode("utf-8")) + rubric.schema_bytes,
        # How a moderation model's categories map onto the policy (docs/policies.md, Dialects).
        "dialects": _dialects(policy, rubric),
    }


def _dialects(policy: Policy, rubric: Rubric) -> dict[str, list[dict[str, Any]]]:
    """The policy's ``dialects:`` sections as rows: where each category leads."""
    out: dict[str, list[dict[str, Any]]] = {}
    if (mapping := policy.moderation_map) is not None:
        out["openai-moderation"] = [
            {"category": name, "label": c.label, "rule": c.rule, "threshold": c.threshold}
            for name, c in mapping.categories.items()
        ]
    if (guard := policy.guard_map) is not None:
        names = dict(zip(GUARD_CODES, LLAMA_GUARD_CATEGORIES, strict=True))
        out["llama-guard"] = [
            {
                "category": code,
                "name": names[code],
                "label": rubric.contract.rule_label(rule),
                "rule": rule,
            }
            for code, rule in guard.categories.items()
        ]
    return out


def cmd_policy_check(args: argparse.Namespace, _settings: Settings) -> int:
    """Exit 0 with the policy's identity and contents, or 2 with every problem."""
    policy = _load(args, args.file)
    if policy is None:
        return INVALID
    doc = {"ok": True, "file": args.file, **describe(policy)}
    head = [
        f"policy    {doc['id']}",
        f"version   {doc['version']}",
        f"identity  {doc['identity']}",
    ]
    if policy.key_version != policy.identity:
        head.append(f"keys      {policy.key_version} (the built-in policy's, from before policies)")
    emit(
        args,
        doc,
        "\n".join(head),
        table(doc["labels"], ["id", "action", "severity", "rules"], title="labels"),
        table(doc["rules"], ["id", "label", "violates", "safe"], title="rules"),
        *(
            table(rows, list(rows[0]), title=f"dialect {name}")
            for name, rows in doc["dialects"].items()
        ),
        f"prompt prefix: ~{doc['prefix_tokens_estimate']} tokens ({doc['prefix_bytes']} bytes: "
        "instructions, labels, rules, examples, output contract; the same for every post)",
        "OK",
    )
    return 0


def cmd_policy_diff(args: argparse.Namespace, _settings: Settings) -> int:
    """Labels and rules added, removed or changed; exit 0 (2 if a file has problems)."""
    a = _load(args, args.a)
    if a is None:
        return INVALID
    b = _load(args, args.b)
    if b is None:
        return INVALID
    changes = [
        {"kind": c.kind, "item": c.item, "change": c.change, "fields": list(c.fields)}
        for c in diff_policies(a, b)
    ]
    same = a.key_version == b.key_version
    doc = {
        "a": {"file": args.a, "identity": a.identity, "key_version": a.key_version},
        "b": {"file": args.b, "identity": b.identity, "key_version": b.key_version},
        "changes": changes,
        "same_keys": same,
    }
    rows = [{**c, "fields": ", ".join(c["fields"]) or "-"} for c in changes]
    conclusion = (
        "same identity: the same keys, nothing to pay"
        if same
        else "new identity: B's keys are new work (dry-run with it to see the cost)"
    )
    emit(
        args,
        doc,
        f"A  {a.identity}  {args.a}",
        f"B  {b.identity}  {args.b}",
        table(rows, ["kind", "item", "change", "fields"], title="changes"),
        f"{len(changes)} change(s); {conclusion}",
    )
    return 0
