"""Settling (lossless end-of-pod accounting): a pod that has ended (`ended`) is settled into the
namespace's durable `Settled` (its GPU-seconds in the current period and its UID, kept in the
GPUBudget status) before its finalizer is removed; settling a UID twice is a no-op, so a
keeper killed between the two writes counts nothing twice, and one killed before them loses
nothing (the finalizer keeps the pod). `namespace_used` = settled + the ledger's unsettled
pods. See docs/budgets.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from fractions import Fraction

from elastic_gpu.core.budget.allowance import Budget, period_bounds
from elastic_gpu.core.budget.errors import BudgetError
from elastic_gpu.core.budget.ledger import Ledger, PodRecord
from elastic_gpu.core.budget.timestamps import Seconds
from elastic_gpu.core.budget.usage import decayed_usage, record_usage, usage

#: The finalizer that holds a GPU pod until its usage is settled (added by the webhook at
#: CREATE, or by the keeper to a GPU pod of a budgeted namespace that lacks it).
FINALIZER = "elasticgpu.io/budget"


@dataclass(frozen=True)
class Settled:
    """The durable part of a namespace's usage (what the keeper keeps in its GPUBudget's
    status): the GPU-seconds in the period starting at `period_start` of the pods that ended
    and were settled, and their UIDs. A settled pod's finalizer is removed after this is
    written; the UID makes settling it again (a keeper killed between the two writes) a no-op.
    """

    period_start: Seconds
    gpu_seconds: Fraction = Fraction(0)
    uids: frozenset[str] = frozenset()


def ended(record: PodRecord, now: Seconds) -> bool:
    """Whether the pod runs no more (`final`: a terminal phase, or being deleted) and every
    run of it has ended by `now` (a pod deleted with a grace period ends at its
    deletionTimestamp, which may lie ahead)."""
    return record.final and all(
        (stop := record.stop(end)) is not None and stop <= now
        for c in record.containers.values() for end in c.runs.values())


def roll(settled: Settled, budget: Budget, now: Seconds) -> Settled:
    """The settled part for the period that holds `now`: a new period starts empty (a pod
    settled in an earlier period ended before it, so it has nothing in the new one). With a
    half-life there are no periods: `period_start` is the instant the settled value was
    taken at (`decay_to` moves it)."""
    if budget.half_life_s is not None:
        return settled
    start, _ = period_bounds(budget, now)
    return settled if settled.period_start == start else Settled(start)


def _decay(value: Fraction, half_life_s: int, seconds: int) -> Fraction:
    return Fraction(float(value) * 2.0 ** (-max(seconds, 0) / half_life_s)).limit_denominator(
        10**6)


def decay_to(settled: Settled, budget: Budget, now: Seconds) -> Settled:
    """With a half-life: the settled value decayed from the instant it was taken to `now`
    (the UIDs kept); without one, `settled` as it is."""
    if budget.half_life_s is None or settled.period_start >= now:
        return settled
    return Settled(now, _decay(settled.gpu_seconds, budget.half_life_s,
                               now - settled.period_start), settled.uids)


def settle(settled: Settled, record: PodRecord, budget: Budget, now: Seconds) -> Settled:
    """`settled` with an ended pod's usage in the current period added, once: a UID already
    settled changes nothing. The pod must have ended (`ended`; a deleted pod is closed at its
    deletionTimestamp by `observe`)."""
    if not ended(record, now):
        raise BudgetError(f"pod {record.uid} has not ended (phase not Succeeded or Failed, not "
                          "being deleted, or a run not over); it cannot be settled")
    current = roll(settled, budget, now)
    if record.uid in current.uids:
        return current
    if budget.half_life_s is not None:
        current = decay_to(current, budget, now)
        used = decayed_usage({record.uid: record}, budget.half_life_s, now).get(
            record.namespace, 0.0)
        return Settled(current.period_start,
                       current.gpu_seconds + Fraction(used).limit_denominator(10**6),
                       current.uids | {record.uid})
    start, end = current.period_start, current.period_start + budget.period_s
    return Settled(start, current.gpu_seconds + record_usage(record, start, end, now),
                   current.uids | {record.uid})


def forget(settled: Settled, gone: Iterable[str]) -> Settled:
    """`settled` without the UIDs of pods that are gone (their finalizer was removed and the
    ledger dropped them: they can be neither observed nor settled again)."""
    return replace(settled, uids=settled.uids - frozenset(gone))


def namespace_used(settled: Settled, ledger: Ledger, namespace: str, budget: Budget,
                   now: Seconds) -> Fraction:
    """GPU-seconds of `namespace` in the current period: the settled part plus the ledger's
    usage of its pods not settled yet."""
    current = roll(settled, budget, now)
    live = {u: r for u, r in ledger.items() if r.namespace == namespace and u not in current.uids}
    if budget.half_life_s is not None:
        decayed = decay_to(current, budget, now).gpu_seconds
        return decayed + Fraction(decayed_usage(live, budget.half_life_s, now).get(
            namespace, 0.0)).limit_denominator(10**6)
    start, end = current.period_start, current.period_start + budget.period_s
    return current.gpu_seconds + usage(live, start, end, now).get(namespace, Fraction(0))
