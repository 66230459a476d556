"""A clock a test moves by hand, for code that takes `clock: Callable[[], float]` (the real one,
`time.monotonic`, by default): time passes when the test says, never by sleeping."""

from __future__ import annotations


class ManualClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
