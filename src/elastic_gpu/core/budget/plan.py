"""What the budget keeper does for one namespace now (`plan_namespace`), and when it must look
again although nothing changed in the API (`next_check`)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

from elastic_gpu.core.budget.allowance import Budget, BudgetState, over_budget, period_bounds
from elastic_gpu.core.budget.ledger import Ledger
from elastic_gpu.core.budget.settle import Settled, ended, forget, namespace_used, roll, settle
from elastic_gpu.core.budget.timestamps import Seconds
from elastic_gpu.core.budget.usage import record_usage


@dataclass(frozen=True)
class NamespacePlan:
    """What the keeper does for one namespace now (`plan_namespace`).

    `settled`: the durable part to write (before any finalizer is removed); `state`: used,
    remaining, the period and the over-budget decision; `release`: UIDs of ended pods whose
    usage `settled` holds, whose finalizer may go once `settled` is written; `changed`:
    whether `settled` differs from what the status holds."""

    settled: Settled
    state: BudgetState
    release: frozenset[str]
    changed: bool


def plan_namespace(budget: Budget, stored: Settled, ledger: Ledger, namespace: str,
                   present: Iterable[str], now: Seconds) -> NamespacePlan:
    """Settle every ended pod of `namespace` the ledger knows into `stored` (rolled to the
    current period), forget the UIDs of pods no longer `present` in the API (their finalizer
    went after they were settled: they cannot come back), and say used / remaining / over."""
    present_uids = frozenset(present)
    settled = roll(stored, budget, now)
    fresh = [r for u, r in sorted(ledger.items()) if r.namespace == namespace
             and u not in settled.uids and ended(r, now)]
    if budget.half_life_s is not None:
        for record in fresh:
            settled = settle(settled, record, budget, now)
    elif fresh:  # `settle` of each, in one sum (not a set copy per pod)
        lo, hi = settled.period_start, settled.period_start + budget.period_s
        settled = Settled(lo, settled.gpu_seconds + sum(
            (record_usage(r, lo, hi, now) for r in fresh), Fraction(0)),
            settled.uids | {r.uid for r in fresh})
    # used before forgetting: a gone pod's record is still in the ledger until the keeper
    # drops it after this write, and must not count again as a live one
    used: Fraction = namespace_used(settled, ledger, namespace, budget, now)
    settled = forget(settled, [u for u in settled.uids if u not in present_uids])
    start, end = period_bounds(budget, now)
    state = BudgetState(used, max(budget.gpu_seconds - used, Fraction(0)), start, end,
                        over_budget(used, budget))
    release = frozenset(u for u in settled.uids if u in ledger)
    return NamespacePlan(settled, state, release, settled != stored)



def next_check(budget: Budget, state: BudgetState, rate: Fraction, now: Seconds,
               refresh_s: int) -> Seconds:
    """When the keeper must look at the namespace again although nothing changed in the API:
    at the period's end (the refill), when the running pods spend the rest of the budget (the
    over-budget flip), and every `refresh_s` while something runs (used moves)."""
    due = [state.period_end]
    if rate > 0:
        due.append(now + refresh_s)
        if not state.over and budget.half_life_s is None:
            due.append(now + max(1, math.ceil(state.remaining / rate)))
    return max(now + 1, min(due))
