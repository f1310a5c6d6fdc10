"""Print a URL as it may be shown: ``python deploy/redact_url.py URL`` (``bin/dev``, ``bin/prod``).

The one redactor (``core.urls.redact_url``): the password, read as SQLAlchemy reads it (it may
hold ``/``, ``?``, ``#`` or a raw ``@``; an empty user name), and secret query parameters
(``?password=``) become ``***``.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Runs before bin/prod has its virtualenv: the pure core needs nothing but the checkout.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from backfill_assets.domain.urls import redact_url  # noqa: E402

if __name__ == "__main__":
    print(redact_url(sys.argv[1] if len(sys.argv) > 1 else ""))
