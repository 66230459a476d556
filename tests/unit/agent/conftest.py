from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # Unix socket paths are limited to 107 bytes: pytest's tmp_path can be too long.
    path = Path(tempfile.mkdtemp(prefix="egpu-dp-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
