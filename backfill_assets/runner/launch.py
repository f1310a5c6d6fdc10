"""Backfills of stale, missing or failed partitions, launched through the webserver's GraphQL API.

Dagster has no server-side "stale or missing" partition selection: the partition list is
computed here from the same GraphQL fields the UI reads, then launched as one backfill per
tenant (tagged ``tenant`` so the run queue's per-tenant limit applies to its runs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from backfill_assets.defs.asset_keys import APPLIED, BLOCKING_GROUPS, LABELS
from backfill_assets.defs.partitions import InvalidPartitionKey, partition_ref
from backfill_assets.domain.urls import redact_url, scrub

LABELS_PATH = LABELS.path
BACKFILL_ASSETS = (LABELS.path, APPLIED.path)
_STALE_CHUNK = 500

_PARTITIONS_QUERY = """
query Partitions($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    __typename
    ... on AssetNode {
      partitionKeys
      assetPartitionStatuses {
        __typename
        ... on DefaultPartitionStatuses { failedPartitions }
      }
    }
  }
}
"""

_STALE_QUERY = """
query Stale($assetKey: AssetKeyInput!, $partitions: [String!]) {
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode { staleStatusByPartition(partitions: $partitions) }
  }
}
"""

_CHECKS_QUERY = """
query Checks($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode {
      assetChecksOrError {
        __typename
        ... on AssetChecks {
          checks {
            name
            partitionStatuses {
              __typename
              ... on AssetCheckDefaultPartitionStatuses { failedPartitions }
            }
          }
        }
      }
    }
  }
}
"""

_LAUNCH_MUTATION = """
mutation Launch($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
    ... on PartitionKeysNotFoundError { message }
    ... on InvalidSubsetError { message }
    ... on UnauthorizedError { message }
  }
}
"""

_BACKFILL_QUERY = """
query Backfill($id: String!) {
  partitionBackfillOrError(backfillId: $id) {
    __typename
    ... on PartitionBackfill { id status numPartitions }
    ... on PythonError { message }
  }
}
"""

DONE_STATUSES = ("COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED")


class GraphQLError(RuntimeError):
    """The webserver answered with an error (or not at all)."""


@dataclass
class PartitionState:
    """What the webserver knows about each partition of moderation_labels."""

    keys: list[str]
    stale: set[str] = field(default_factory=set)
    missing: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    check_failed: set[str] = field(default_factory=set)
    # Keys the webserver lists that fail validation (e.g. a tenant added by hand in the UI):
    # never selected, never launched; reported so an operator can delete them.
    invalid: list[str] = field(default_factory=list)


def _valid(key: str) -> bool:
    try:
        partition_ref(key)
    except InvalidPartitionKey:
        return False
    return True


def select_partitions(
    state: PartitionState,
    stale: bool = False,
    missing: bool = False,
    failed: bool = False,
    check_failed: bool = False,
    tenants: Sequence[str] = (),
) -> list[str]:
    """The union of the requested sets, in the asset's key order, optionally for some tenants."""
    chosen: set[str] = set()
    for wanted, keys in (
        (stale, state.stale),
        (missing, state.missing),
        (failed, state.failed),
        (check_failed, state.check_failed),
    ):
        if wanted:
            chosen |= keys
    return [
        k
        for k in state.keys
        if k in chosen and _valid(k) and (not tenants or partition_ref(k).tenant_id in tenants)
    ]


def by_tenant(keys: Iterable[str]) -> dict[str, list[str]]:
    """Partition keys grouped by tenant (one backfill each)."""
    out: dict[str, list[str]] = {}
    for k in keys:
        out.setdefault(partition_ref(k).tenant_id, []).append(k)
    return out


class DagsterClient:
    """A small GraphQL client for the webserver (timeouts on every call)."""

    def __init__(
        self, base_url: str, timeout: float = 30.0, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(timeout=timeout, transport=transport)

    def close(self) -> None:
        """Release the HTTP connection pool."""
        self._http.close()

    def query(self, text: str, variables: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Run one GraphQL document; raises GraphQLError on transport or GraphQL errors."""
        try:
            resp = self._http.post(
                f"{self.base_url}/graphql", json={"query": text, "variables": variables or {}}
            )
            resp.raise_for_status()
        except httpx.InvalidURL:
            # Its message quotes the part it could not read: maybe a piece of a password.
            raise GraphQLError(f"{redact_url(self.base_url)}: is not a URL") from None
        except httpx.HTTPError as exc:
            # The URL may carry a user and password (a proxy's basic auth): never echoed.
            why = scrub(f"{type(exc).__name__}: {exc}", self.base_url)
            raise GraphQLError(f"{redact_url(self.base_url)}: {why}") from None
        try:
            doc = resp.json()
        except ValueError:  # --url names something that is not a Dagster webserver
            doc = None
        if not isinstance(doc, dict):
            raise GraphQLError(f"{redact_url(self.base_url)}: the answer is not GraphQL's JSON")
        if doc.get("errors"):
            errors = doc["errors"] if isinstance(doc["errors"], list) else [doc["errors"]]
            raise GraphQLError(
                "; ".join(str(e.get("message") if isinstance(e, dict) else e) for e in errors)[:500]
            )
        data = doc.get("data")
        if not isinstance(data, dict):
            raise GraphQLError(f"{redact_url(self.base_url)}: the answer is not GraphQL's JSON")
        return data

    def partition_state(self) -> PartitionState:
        """Stale, missing, failed and check-failed partitions of moderation_labels."""
        key = {"path": LABELS_PATH}
        node = self.query(_PARTITIONS_QUERY, {"assetKey": key})["assetNodeOrError"]
        if node.get("__typename") != "AssetNode":
            raise GraphQLError(f"moderation_labels not found: {node.get('__typename')}")
        listed = [str(k) for k in node["partitionKeys"]]
        state = PartitionState(
            keys=[k for k in listed if _valid(k)], invalid=[k for k in listed if not _valid(k)]
        )
        statuses = node["assetPartitionStatuses"]
        state.failed = set(statuses.get("failedPartitions") or [])
        for i in range(0, len(state.keys), _STALE_CHUNK):
            chunk = state.keys[i : i + _STALE_CHUNK]
            found = self.query(_STALE_QUERY, {"assetKey": key, "partitions": chunk})
            for pk, status in zip(
                chunk, found["assetNodeOrError"]["staleStatusByPartition"], strict=True
            ):
                if status == "STALE":
                    state.stale.add(pk)
                elif status == "MISSING":
                    state.missing.add(pk)
        checks = self.query(_CHECKS_QUERY, {"assetKey": key})["assetNodeOrError"]
        for chk in checks["assetChecksOrError"].get("checks", []):
            # Failed on spend or drift alone counts here too; ``launch`` leaves those out by the
            # plan's rule (they are applied and done).
            if chk["name"] in BLOCKING_GROUPS and chk.get("partitionStatuses"):
                state.check_failed |= set(chk["partitionStatuses"].get("failedPartitions") or [])
        return state

    def launch_backfill(
        self, partitions: Sequence[str], title: str, tags: Mapping[str, str]
    ) -> str:
        """Launch one asset backfill of labels + apply (checks included); returns its id.

        Raises ``InvalidPartitionKey`` before any request if a key fails validation.
        """
        for key in partitions:
            partition_ref(key)
        params = {
            "partitionNames": list(partitions),
            "assetSelection": [{"path": p} for p in BACKFILL_ASSETS],
            "title": title,
            "tags": [{"key": k, "value": v} for k, v in tags.items()],
        }
        res = self.query(_LAUNCH_MUTATION, {"params": params})["launchPartitionBackfill"]
        if res.get("__typename") != "LaunchBackfillSuccess":
            raise GraphQLError(f"{res.get('__typename')}: {res.get('message', '')}"[:500])
        return str(res["backfillId"])

    def backfill_status(self, backfill_id: str) -> str:
        """The backfill's status (REQUESTED, COMPLETED_SUCCESS, COMPLETED_FAILED, ...)."""
        res = self.query(_BACKFILL_QUERY, {"id": backfill_id})["partitionBackfillOrError"]
        if res.get("__typename") != "PartitionBackfill":
            raise GraphQLError(f"backfill {backfill_id}: {res.get('message', res)}")
        return str(res["status"])

    def backfill_url(self, backfill_id: str) -> str:
        """Where the backfill shows in the UI."""
        return f"{self.base_url}/runs/b/{backfill_id}"
