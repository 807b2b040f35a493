"""Small JSON caches on disk, one file each under ``$HOTCOMPILE_CACHE`` (default
``~/.cache/hotcompile``): the GEMM dispatcher's choices and the speed gate's timings.

Reads forgive a missing or corrupt file (an empty cache); writes go through a temporary file
and a rename, so concurrent processes never see half a file, and a read-only home only costs
the on-disk copy (callers keep their in-memory dict).
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any


def path(name: str) -> pathlib.Path:
    """The cache file ``name`` under the cache root."""
    root = os.environ.get("HOTCOMPILE_CACHE") or str(pathlib.Path.home() / ".cache" / "hotcompile")
    return pathlib.Path(root) / name


def load(name: str) -> dict[str, Any]:
    """The cache's contents, or ``{}`` when the file is missing or unreadable."""
    try:
        return json.loads(path(name).read_text())
    except (OSError, ValueError):
        return {}


def save(name: str, data: dict[str, Any]) -> None:
    """Write ``data`` atomically; an unwritable cache root is ignored."""
    try:
        f = path(name)
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(f)
    except OSError:
        pass
