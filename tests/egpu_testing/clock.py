"""Time for tests: a clock the test moves by hand, for code that takes `clock: Callable[[],
float]` (the real one, `time.monotonic`, by default), and a `sleep` that returns at once, for
async code that takes one: time passes when the test says, never by sleeping."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class ManualClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class InstantSleeps:
    """A `sleep` for code that takes one (`asyncio.sleep` by default): it only yields to the
    event loop, and records how long it was asked to wait, for the test to check."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await asyncio.sleep(0)


async def turns_until(condition: Callable[[], bool], turns: int = 1000) -> None:
    """Yield to the event loop until `condition` holds (no time passes: for code whose waits
    are `InstantSleeps`)."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"not within {turns} turns of the event loop")
