"""Budget ledger helpers for tests: a ledger folded from many observations at once, and a
namespace's used / remaining / over without a settled part. The keeper folds one observation at
a time (`core.budget.ledger.merge`) and asks `core.budget.plan.plan_namespace`, which adds the
settled part; these are the short forms the ledger's own tests read best in."""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction

from elastic_gpu.core.budget.allowance import Budget, BudgetState, over_budget, period_bounds
from elastic_gpu.core.budget.ledger import Ledger, PodRecord, merge
from elastic_gpu.core.budget.timestamps import Seconds
from elastic_gpu.core.budget.usage import decayed_usage, usage


def fold_all(records: Iterable[PodRecord | None], ledger: Ledger | None = None
             ) -> dict[str, PodRecord]:
    """`ledger` (empty by default, never changed) with every record merged in, in order (None:
    not a GPU pod, nothing)."""
    out = dict(ledger or {})
    for record in records:
        if record is not None:
            known = out.get(record.uid)
            out[record.uid] = record if known is None else merge(known, record)
    return out


def budget_state(budget: Budget, ledger: Ledger, namespace: str, now: Seconds) -> BudgetState:
    """Used and remaining GPU-seconds of `namespace` now, and whether it is over budget, from
    the ledger alone (nothing settled).

    With a hard period: the usage in the current period (a pod running across the boundary
    counts only its part after it: the budget refills at the period's end). With a half-life:
    the decayed usage; the period then only says when the status is refreshed."""
    start, end = period_bounds(budget, now)
    scoped = {u: r for u, r in ledger.items() if r.namespace == namespace}
    used: Fraction | float
    if budget.half_life_s is not None:
        used = decayed_usage(scoped, budget.half_life_s, now).get(namespace, 0.0)
    else:
        used = usage(scoped, start, end, now).get(namespace, Fraction(0))
    remaining = max(budget.gpu_seconds - used, 0)
    return BudgetState(used, remaining, start, end, over_budget(used, budget))
