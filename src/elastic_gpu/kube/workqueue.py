"""A work queue of keys, as client-go's rate-limited work queue:

- a key waiting in the queue is there once, however often it is added (deduplication);
- a key handed to a worker is never handed to another until `done`; re-added meanwhile, it is
  queued again at `done` (so a change seen during a reconcile is reconciled after it);
- `add_rate_limited` re-adds after a per-key exponential backoff (`base * 2**failures`, capped
  at `max`: 5 ms .. 1000 s in client-go; ours defaults to 5 ms .. 10 s), `forget` resets it
  after a success; `add_after` schedules an add (the earliest of several wins);
- `shutdown` wakes every waiting `get` with None.

One addition to client-go's: two lanes. `add(key)` is news (a watch event, a retry); `add(key,
resync=True)` is a pass over what may already be in sync (a new leader's look at every object,
an informer's first list). `get` hands out the news first, so a takeover's pass over thousands
of existing objects does not hold up the object created a moment ago; a key queued for the
resync that gets news moves to the news lane (it keeps one place in the queue). The resync
lane is served whenever no news waits, and at least once every `RESYNC_EVERY` keys handed out
while news keeps coming: a steady stream of news (a tenant with `edit` rewriting their own
objects in a loop) slows a resync down but cannot stop it.
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


#: the lanes, served in this order
NEWS, RESYNC = 0, 1
#: while news waits, one resync key is handed out after this many news keys in a row
RESYNC_EVERY = 8


class WorkQueue(Generic[K]):
    def __init__(self, backoff: ExponentialBackoff[K] | None = None) -> None:
        self.backoff: ExponentialBackoff[K] = backoff or ExponentialBackoff()
        #: per lane, (key, sequence) in order; an entry is live while `_queued[key]` is its
        #: sequence (a key moved to the news lane leaves a dead entry behind, skipped by get)
        self._lanes: tuple[collections.deque[tuple[K, int]], ...] = (
            collections.deque(), collections.deque())
        self._queued: dict[K, int] = {}
        self._sequence = 0
        #: key -> lane, for every key added and not yet handed out (queued, or waiting for a
        #: worker's `done`)
        self._dirty: dict[K, int] = {}
        self._processing: set[K] = set()
        self._waiting: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._getters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._shutting_down = False
        #: news keys handed out since the resync lane was last served
        self._news_run = 0

    def __len__(self) -> int:
        return len(self._queued)

    def queued(self, resync: bool) -> int:
        """Keys waiting in the news lane (False) or the resync lane (True)."""
        lane = RESYNC if resync else NEWS
        return sum(1 for key, seq in self._lanes[lane] if self._queued.get(key) == seq)

    def add(self, key: K, *, resync: bool = False) -> None:
        if self._shutting_down:
            return
        lane = RESYNC if resync else NEWS
        current = self._dirty.get(key)
        if current is not None:
            if lane < current:  # news of a key waiting for the resync: it moves up
                self._dirty[key] = lane
                if key in self._queued:
                    self._push(key, lane)
            return
        self._dirty[key] = lane
        if key in self._processing:
            return  # queued again at done()
        self._push(key, lane)

    def move_to_resync(self) -> None:
        """Every key queued now goes to the resync lane, in its order (a new leader's queue
        holds what its informers added while it followed: whatever it was, it is no news
        once the leader looks at every object)."""
        moved = [key for key, seq in self._lanes[NEWS] if self._queued.get(key) == seq]
        self._lanes[NEWS].clear()
        for key in self._dirty:  # (and a key a worker holds comes back to the resync lane)
            self._dirty[key] = RESYNC
        for key in moved:
            self._push(key, RESYNC)

    def _push(self, key: K, lane: int) -> None:
        self._sequence += 1
        self._queued[key] = self._sequence
        self._lanes[lane].append((key, self._sequence))
        self._notify()

    def _pop(self) -> K | None:
        order = (RESYNC, NEWS) if self._news_run >= RESYNC_EVERY else (NEWS, RESYNC)
        for index in order:
            lane = self._lanes[index]
            while lane:
                key, seq = lane.popleft()
                if self._queued.get(key) == seq:
                    del self._queued[key]
                    self._news_run = self._news_run + 1 if index == NEWS else 0
                    return key
        return None

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
        """The next key (now being processed: call `done` after), or None once shut down:
        the news lane's first, else the resync lane's."""
        while not self._queued and not self._shutting_down:
            getter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._getters.append(getter)
            try:
                await getter
            except asyncio.CancelledError:
                if getter.done() and not getter.cancelled():
                    self._notify()  # pass the wake-up on to another worker
                raise
        key = self._pop()
        if key is None:
            return None
        self._processing.add(key)
        del self._dirty[key]
        if self._queued:
            self._notify()
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        lane = self._dirty.get(key)
        if lane is not None:
            self._push(key, lane)

    def shutdown(self) -> None:
        self._shutting_down = True
        for _, handle in self._waiting.values():
            handle.cancel()
        self._waiting.clear()
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)
