"""Counting what a path costs the placement engine and the pod reader: the calls that change
the engine's ledger or usage, and `PodInfo.from_manifest` (tests of the bind's cost, and
bench/state_bind.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from elastic_gpu.core.placement import Engine
from elastic_gpu.scheduler.state import PodInfo

#: The engine methods that change its allocations or the usage decisions read.
CHANGES = ("allocate", "release", "rekey", "set_outside_usage")


@contextmanager
def engine_calls(engine: Engine) -> Iterator[Counter[str]]:
    """Count, per name, the calls of `CHANGES` on this engine while the block runs (the
    methods are wrapped on the instance; a state that builds a new engine is not followed)."""
    calls: Counter[str] = Counter()

    def counted(name: str) -> Callable[..., Any]:
        method = getattr(engine, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return method(*args, **kwargs)
        return call

    for name in CHANGES:
        setattr(engine, name, counted(name))
    try:
        yield calls
    finally:
        for name in CHANGES:
            delattr(engine, name)


@contextmanager
def manifest_reads() -> Iterator[Counter[str]]:
    """Count `PodInfo.from_manifest` calls (under "from_manifest") while the block runs."""
    calls: Counter[str] = Counter()
    original = PodInfo.__dict__["from_manifest"]
    read = original.__func__

    def counted(pod: Any) -> PodInfo:
        calls["from_manifest"] += 1
        result: PodInfo = read(pod)
        return result

    PodInfo.from_manifest = staticmethod(counted)  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        PodInfo.from_manifest = original  # type: ignore[method-assign]
