#!/usr/bin/env bash
# Sourced by bin/dev, bin/prod, bin/test and bench/run: create or refresh .venv from the pinned
# constraints.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
STAMP="$VENV/.installed-$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" | sha256sum | cut -c1-16)"
if [ ! -f "$STAMP" ]; then
  echo "[setup] installing pinned dependencies into .venv (first run only, ~1 min)" >&2
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  # The distribution was called backfill-assets before it took its command's name.
  "$VENV/bin/python" -m pip uninstall -q -y backfill-assets >/dev/null 2>&1 || true
  "$VENV/bin/python" -m pip install -q -c "$ROOT/constraints.txt" -e "$ROOT[dev]" >&2
  rm -f "$VENV"/.installed-*
  touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
