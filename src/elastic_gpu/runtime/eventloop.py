"""The event loop the scheduler's processes run on: uvloop when installed, else asyncio's.

Both processes of the extender (the HTTP server and its API worker) spend most of their time
in socket I/O and event-loop bookkeeping, on the same cores as the control plane; uvloop does
that work in C (docs/benchmarks.md has the side-by-side figures). `EGPU_EVENT_LOOP=asyncio`
forces the standard loop (for comparison, or where uvloop misbehaves).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


def loop_name() -> str:
    if os.environ.get("EGPU_EVENT_LOOP", "").lower() == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


@contextlib.contextmanager
def stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT set `stop` (a graceful drain instead of a traceback);
    the handlers are removed on the way out. Off the main thread (tests, embedders) the signals
    are not ours to take, and nothing is installed."""
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, stop.set)
            installed.append(signum)
        except (NotImplementedError, RuntimeError, ValueError):
            log.debug("not installing a handler for signal %d: not the main thread", signum)
    try:
        yield
    finally:
        for installed_signum in installed:
            loop.remove_signal_handler(installed_signum)


def run(main: Coroutine[Any, Any, T]) -> T:
    if loop_name() == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
