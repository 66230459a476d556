"""One worker loop for every controller: take a key, handle it, requeue or forget it, count it.

Every controller had written this loop again (claims, budgets, the MIG adapter, defrag), each
with the same bookkeeping: `done` always, `forget` on success, a rate-limited requeue on a
failure, the reconcile counter and histogram. They differed only in what a key means, which
errors are expected (a conflict, an object gone: a short retry, logged at info) and when a
handled key comes back. Those differences are the arguments here; the loop is written once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from elastic_gpu.controller.manager import Metrics
from elastic_gpu.kube.workqueue import WorkQueue

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Done:
    """The key was handled: its failures are forgotten; it comes back after `after` seconds
    (a periodic resync), or when an event adds it again (None)."""

    after: float | None = None


@dataclass(frozen=True)
class Retry:
    """Handled in part (some item of it failed alone): back off and try again soon."""

    reason: str


Outcome = Done | Retry


async def work(queue: WorkQueue[str], controller: str, metrics: Metrics,
               handle: Callable[[str], Awaitable[Outcome]], *,
               expected: tuple[type[Exception], ...] = (),
               describe: Callable[[str], str] = str) -> None:
    """Handle keys from `queue` until it shuts down. An exception of `expected` is a retry
    (result `requeue`, logged at info); any other is an error (logged with its traceback);
    both come back after the queue's backoff. `describe(key)` names the key in the logs."""
    while True:
        key = await queue.get()
        if key is None:
            return
        started = time.perf_counter()
        result = "ok"
        try:
            outcome = await handle(key)
            if isinstance(outcome, Retry):
                result = "requeue"
                delay = queue.add_rate_limited(key)
                log.info("%s: %s; again in %.3f s", describe(key), outcome.reason, delay)
            else:
                queue.forget(key)
                if outcome.after is not None:
                    queue.add_after(key, outcome.after)
        except asyncio.CancelledError:
            raise
        except expected as err:
            result = "requeue"
            delay = queue.add_rate_limited(key)
            log.info("%s: %s; again in %.3f s", describe(key), err, delay)
        except Exception:
            result = "error"
            delay = queue.add_rate_limited(key)
            log.exception("%s failed; again in %.3f s", describe(key), delay)
        finally:
            queue.done(key)
            metrics.reconciles.labels(controller, result).inc()
            metrics.reconcile_seconds.labels(controller).observe(time.perf_counter() - started)


async def run_rounds(queue: WorkQueue[str], controller: str, metrics: Metrics,
                     handle: Callable[[str], Awaitable[Outcome]], kick: Callable[[], None], *,
                     describe: str, expected: tuple[type[Exception], ...] = (),
                     off: str | None = None) -> None:
    """A controller whose work is one round over the cluster at a time (one key, which `kick`
    queues on its inputs' changes): with `off` (why it is off, logged) it waits to be
    cancelled, never woken; else a first round now, then `work` until the queue shuts down."""
    if off is not None:
        log.info(off)
        await asyncio.Event().wait()  # until cancelled
    kick()
    try:
        await work(queue, controller, metrics, handle, expected=expected,
                   describe=lambda _: describe)
    finally:
        queue.shutdown()
