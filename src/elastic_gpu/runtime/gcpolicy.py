"""Garbage collection for a process that keeps a large state for its lifetime (the extender).

CPython's cyclic collector visits every tracked object in a full (generation 2) collection.
The extender's state at 5,000 nodes and 40,000 pods is about 630,000 objects, and a full
collection of them stalled the process for about a second on the 2-core box
(docs/benchmarks.md, "The extender at scale"): a filter answer late by that much is a
scheduling cycle lost, and at 15,000 nodes kube-scheduler's extender timeout comes close. Full
collections come whenever the objects that survived younger collections grew by a quarter, so
a long-running extender meets them again and again, and during its start (the state growing
from nothing) several times over.

The state is freed by reference counting (its records hold no cycles); the collector is
needed for the short-lived cycles of the event loop and the HTTP stack, which die young. So
after every full collection the survivors are frozen (`gc.freeze`: moved to a generation the
collector never visits), and the next full collection visits only what survived since. Cost:
a cycle among frozen objects is never collected; only objects that lived through a full
collection are frozen, and those are the state's.
"""

from __future__ import annotations

import gc
from typing import Any


def _freeze_after_full_collection(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info.get("generation") == 2:
        gc.freeze()


def freeze_survivors() -> None:
    """From now on, every full collection freezes what survived it (idempotent)."""
    if _freeze_after_full_collection not in gc.callbacks:
        gc.callbacks.append(_freeze_after_full_collection)


def stop_freezing() -> None:
    """Undo `freeze_survivors` (tests): no more freezing, the frozen objects back in play."""
    if _freeze_after_full_collection in gc.callbacks:
        gc.callbacks.remove(_freeze_after_full_collection)
    gc.unfreeze()
