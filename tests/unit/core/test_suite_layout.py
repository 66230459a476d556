"""The suite itself: pytest imports test modules by basename (rootdir-relative, no packages),
so two files of one name anywhere under tests/ stop the whole collection with "import file
mismatch" (it happened: unit and integration test_mig_api.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]


def test_no_two_test_files_share_a_basename() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert not [n for n, count in names.items() if count > 1]
