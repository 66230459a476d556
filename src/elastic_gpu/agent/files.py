"""Atomic JSON files (the DRA plugin's checkpoint and CDI specs, the fake backend's MIG state):
written to a temporary file in the same directory, flushed to disk, then
renamed over the target, so a reader (the container runtime reading a CDI spec, the plugin
reading its checkpoint after a crash) sees the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, data: Any, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=1, sort_keys=True)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def remove_file(path: Path) -> bool:
    """Remove `path`; True when it was there (a missing file is not an error)."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
