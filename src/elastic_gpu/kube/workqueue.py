"""A work queue of keys, as client-go's rate-limited work queue:

- a key waiting in the queue is there once, however often it is added (deduplication);
- a key handed to a worker is never handed to another until `done`; re-added meanwhile, it is
  queued again at `done` (so a change seen during a reconcile is reconciled after it);
- `add_rate_limited` re-adds after a per-key exponential backoff (`base * 2**failures`, capped
  at `max`: 5 ms .. 1000 s in client-go; ours defaults to 5 ms .. 10 s), `forget` resets it
  after a success; `add_after` schedules an add (the earliest of several wins);
- `shutdown` wakes every waiting `get` with None.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class ExponentialBackoff(Generic[K]):
    """Per-key delays: base, 2*base, 4*base, ... up to `max_s`, until `forget`."""

    def __init__(self, base_s: float = 0.005, max_s: float = 10.0) -> None:
        if base_s <= 0 or max_s < base_s:
            raise ValueError(f"backoff base {base_s} s / max {max_s} s: need 0 < base <= max")
        self.base_s = base_s
        self.max_s = max_s
        self._failures: dict[K, int] = {}

    def when(self, key: K) -> float:
        """The delay before the next retry of `key`, counting this failure."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        if failures > 60:  # 2**60 * base exceeds any max: avoid float overflow
            return self.max_s
        return min(self.max_s, self.base_s * (1 << failures))

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)


class WorkQueue(Generic[K]):
    def __init__(self, backoff: ExponentialBackoff[K] | None = None) -> None:
        self.backoff: ExponentialBackoff[K] = backoff or ExponentialBackoff()
        self._queue: collections.deque[K] = collections.deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._waiting: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._getters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._shutting_down = False

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def add(self, key: K) -> None:
        if self._shutting_down or key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return  # queued again at done()
        self._queue.append(key)
        self._notify()

    def _notify(self) -> None:
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return

    def add_after(self, key: K, delay_s: float) -> None:
        if self._shutting_down:
            return
        if delay_s <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay_s
        current = self._waiting.get(key)
        if current is not None:
            if current[0] <= due:
                return
            current[1].cancel()
        self._waiting[key] = (due, loop.call_at(due, self._fire, key))

    def _fire(self, key: K) -> None:
        self._waiting.pop(key, None)
        self.add(key)

    def add_rate_limited(self, key: K) -> float:
        """Re-add after the key's next backoff delay; returns the delay."""
        delay = self.backoff.when(key)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        self.backoff.forget(key)

    def num_requeues(self, key: K) -> int:
        return self.backoff.failures(key)

    async def get(self) -> K | None:
        """The next key (now being processed: call `done` after), or None once shut down."""
        while not self._queue and not self._shutting_down:
            getter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except asyncio.CancelledError:
                if getter.done() and not getter.cancelled():
                    self._notify()  # pass the wake-up on to another worker
                raise
        if not self._queue:
            return None
        key = self._queue.popleft()
        self._processing.add(key)
        self._dirty.discard(key)
        if self._queue:
            self._notify()
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self._notify()

    def shutdown(self) -> None:
        self._shutting_down = True
        for _, handle in self._waiting.values():
            handle.cancel()
        self._waiting.clear()
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)
