"""When to start a supervised process again: the pure half of a supervisor.

A supervisor (the agent's MPS daemons, agent/mps_supervisor.py) looks at its process now and
then and asks `observe` what to do: nothing (it runs), start it now, or wait. A process that
dies is started again at once the first time, then after a delay that doubles with every
death in a row (`initial_s`, 2x, 4x, ... capped at `max_s`), so a daemon that cannot start
(no driver, a bad card) does not spin; one that stays up for `stable_s` is forgiven its
earlier deaths. No I/O and no clock of its own: the caller passes `now`.

A process that runs but does not answer (a hung daemon: its liveness probe failed) is killed by
the supervisor and counts as a death like any other (`hung`), so it is restarted with the same
backoff; `probe_due` says when to ask it again.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Backoff:
    initial_s: float = 1.0
    max_s: float = 60.0
    #: Up this long without a death: the next death is the first again.
    stable_s: float = 60.0

    def delay(self, deaths: int) -> float:
        """The wait before the start that follows the `deaths`-th death in a row (0: none)."""
        if deaths <= 1:
            return 0.0
        return float(min(self.initial_s * 2 ** (deaths - 2), self.max_s))


class Action(enum.Enum):
    NOTHING = "nothing"
    START = "start"
    WAIT = "wait"


@dataclass(frozen=True)
class ProcessState:
    """What the supervisor knows of one process."""

    up: bool = False
    #: Deaths (or failed starts) in a row, since it last stayed up `stable_s`.
    deaths: int = 0
    #: When it was last seen to come up (for `stable_s`), or to go down (for the delay).
    since: float = 0.0
    #: Why it is down, for people (the last start's error, or "exited").
    reason: str = "not started"
    started_once: bool = False


def observe(state: ProcessState, alive: bool, now: float, backoff: Backoff
            ) -> tuple[ProcessState, Action]:
    """The new state after seeing the process `alive` (or not) at `now`, and what to do."""
    if alive:
        if not state.up:
            return ProcessState(True, state.deaths, now, "", True), Action.NOTHING
        if state.deaths and now - state.since >= backoff.stable_s:
            return replace(state, deaths=0), Action.NOTHING
        return state, Action.NOTHING
    if state.up:  # it was up and is gone: one more death
        state = ProcessState(False, state.deaths + 1, now, "exited", True)
    if not state.started_once:
        return state, Action.START
    if now - state.since >= backoff.delay(state.deaths):
        return state, Action.START
    return state, Action.WAIT


def failed_start(state: ProcessState, now: float, reason: str) -> ProcessState:
    """A start that did not bring the process up counts as a death."""
    return ProcessState(False, state.deaths + 1, now, reason, True)


def hung(state: ProcessState, now: float, reason: str) -> ProcessState:
    """A process that still runs but failed its liveness probe (the supervisor kills it): one
    death, as if it had exited, with the reason people are shown; `observe` then restarts it
    with the backoff."""
    return ProcessState(False, state.deaths + 1, now, reason, True)


def probe_due(last_probe: float | None, now: float, every_s: float) -> bool:
    """Whether a running process is due its liveness probe: never when `every_s` is 0 (probes
    off), at once when it was never probed, else `every_s` after the last probe."""
    if every_s <= 0:
        return False
    return last_probe is None or now - last_probe >= every_s
