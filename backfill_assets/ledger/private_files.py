"""Files the backfill creates hold tenants' posts and spend: readable by their owner only.

On a shared host the default umask (022) makes the store, its lock files, Dagster's run shards
and compute logs readable by every local user. Each process of ours (the CLI, and the code
location Dagster's webserver, daemon and run workers load) sets the umask to 077 first, so
everything it creates is 0600 (files) or 0700 (directories); a store created before that is
tightened when it is opened.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PRIVATE_UMASK = 0o077


def private_umask() -> None:
    """From now on this process creates files 0600 and directories 0700."""
    os.umask(PRIVATE_UMASK)


def tighten(path: Path) -> None:
    """Drop group and other permissions of ``path`` if it exists and is ours."""
    with contextlib.suppress(OSError):
        st = path.stat()
        if st.st_uid == os.getuid() and st.st_mode & 0o077:
            path.chmod(st.st_mode & 0o700)
