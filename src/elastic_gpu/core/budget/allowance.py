"""A namespace's allowance: `Budget` gives GPU-seconds per period (refilled at each period's
end; periods are `period_s` long from `anchor`), or, with `half_life_s`, a decayed usage instead
of a hard period: every GPU-second counts 2^(-age / half_life), so a namespace that stops using
GPUs recovers smoothly. `over_budget` is the one over-budget decision."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from elastic_gpu.core.budget.errors import BudgetError
from elastic_gpu.core.budget.timestamps import Seconds

#: The shortest budget period. The status names its period (start and end), so it changes, and
#: is written, at least once a period for every budget, pods or not: a 1 s period rewrote every
#: budget every second forever. A minute bounds that at one write per budget per minute (the
#: order of kube-controller-manager's quota resync) while GPU time is still metered per second;
#: a budget is GPU-hours, and shorter periods account nothing a minute does not.
MIN_PERIOD_S = 60


@dataclass(frozen=True)
class Budget:
    """A namespace's allowance: `gpu_seconds` per period of `period_s` seconds (at least
    `MIN_PERIOD_S`), periods counted from `anchor`; with `half_life_s`, the decayed usage is
    compared instead."""

    gpu_seconds: int
    period_s: int
    anchor: Seconds = 0
    half_life_s: int | None = None

    def __post_init__(self) -> None:
        if self.gpu_seconds < 0:
            raise BudgetError(f"gpuHours gives {self.gpu_seconds} GPU-seconds; must be >= 0")
        if self.period_s < MIN_PERIOD_S:
            raise BudgetError(f"period={self.period_s}s must be at least {MIN_PERIOD_S}s "
                              "(the status is rewritten once a period)")
        if self.half_life_s is not None and self.half_life_s <= 0:
            raise BudgetError(f"halfLife={self.half_life_s}s must be positive")


def period_bounds(budget: Budget, now: Seconds) -> tuple[Seconds, Seconds]:
    """The period [start, end) that holds `now`."""
    start = budget.anchor + ((now - budget.anchor) // budget.period_s) * budget.period_s
    return start, start + budget.period_s


@dataclass(frozen=True)
class BudgetState:
    used: Fraction | float
    remaining: Fraction | float
    period_start: Seconds
    period_end: Seconds
    over: bool


def over_budget(used: Fraction | float, budget: Budget) -> bool:
    """Whether a namespace that used `used` GPU-seconds is over `budget`: at or above what it
    allows (a budget of 0 is spent from the start). The keeper writes it as the GPUBudget's
    `OverBudget` condition, which the webhook reads (`priority.downgrade_class`)."""
    return used >= budget.gpu_seconds
