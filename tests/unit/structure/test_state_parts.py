"""The scheduler's state is objects joined by a handle, not mixins (docs/scheduler.md, "The
state behind one lock"): read from the source with `ast`, like the import-graph test.

`SchedulerState` inherits from nothing; no class of `scheduler/state/` inherits from another of
them (a part that did would share its fields again); every part is built from a `StateHandle`
and the parts it calls, each passed to its constructor; and each part's file stays within
`MAX_LINES` (the cap is met by the parts' own size, not by cutting one class into files).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
STATE = ROOT / "src" / "elastic_gpu" / "scheduler" / "state"
MAX_LINES = 600
#: file -> the part it holds (built by `SchedulerState`, each from a handle)
PARTS = {
    "wakeups.py": "Wakeups",
    "usage.py": "PodUsage",
    "ledger.py": "Ledger",
    "inventory.py": "Inventory",
    "placement.py": "Placement",
    "claims.py": "ClaimCaches",
}


def _classes() -> dict[str, tuple[Path, ast.ClassDef]]:
    out = {}
    for path in sorted(STATE.glob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef):
                out[node.name] = (path, node)
    return out


def _base_names(cls: ast.ClassDef) -> list[str]:
    return [ast.unparse(base) for base in cls.bases]


def test_the_state_front_inherits_from_nothing() -> None:
    _, front = _classes()["SchedulerState"]
    assert _base_names(front) == []


def test_no_state_class_inherits_from_another_state_class() -> None:
    classes = _classes()
    inheriting = {name: [b for b in _base_names(cls) if b in classes]
                  for name, (_, cls) in classes.items()}
    assert {name: bases for name, bases in inheriting.items() if bases} == {}


@pytest.mark.parametrize(("file", "part"), sorted(PARTS.items()))
def test_each_part_is_built_from_the_handle_and_is_no_mixin(file: str, part: str) -> None:
    path, cls = _classes()[part]
    assert path.name == file
    assert _base_names(cls) == []
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    first = init.args.args[1]
    assert (first.arg, ast.unparse(first.annotation) if first.annotation else None) == \
        ("handle", "StateHandle")


@pytest.mark.parametrize("path", sorted(STATE.glob("*.py")), ids=lambda p: p.name)
def test_each_state_file_is_within_the_line_cap(path: Path) -> None:
    assert len(path.read_text().splitlines()) < MAX_LINES


def test_every_part_is_built_by_the_front() -> None:
    _, front = _classes()["SchedulerState"]
    init = next(n for n in front.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    built = {ast.unparse(node.func) for node in ast.walk(init) if isinstance(node, ast.Call)}
    assert set(PARTS.values()) | {"StateHandle"} <= built
