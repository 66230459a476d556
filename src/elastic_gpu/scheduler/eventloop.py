"""The event loop the scheduler's processes run on: uvloop when installed, else asyncio's.

Both processes of the extender (the HTTP server and its API worker) spend most of their time
in socket I/O and event-loop bookkeeping, on the same cores as the control plane; uvloop does
that work in C (docs/benchmarks.md has the side-by-side figures). `EGPU_EVENT_LOOP=asyncio`
forces the standard loop (for comparison, or where uvloop misbehaves).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_name() -> str:
    if os.environ.get("EGPU_EVENT_LOOP", "").lower() == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    if loop_name() == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
