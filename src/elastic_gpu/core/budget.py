"""Namespace GPU budgets: the GPU-time ledger and the over-budget decision. Pure, no I/O.

Consumption is the compute share of every GPU container times the time it ran, read from what
the API says of a pod (DESIGN.md 7.4):

- the share (`container_shares`): from the pod's `elasticgpu.io/assignment` when it has one
  (the cards it was given: a whole card counts 1.0, a share its milli / 1000, a MIG instance its
  card fraction, `core.mig.profiles.card_fraction`: an A30 `1g` 1/4, an A100 `1g` 1/7;
  time-sliced replicas the milli the assignment gives them; containers the
  `claims` mark backs with an ElasticGPU count the ElasticGPU's cards, which the assignment
  lists for them), otherwise from its request (`core.request`, the one reader of resources);
- the time (`container_runs`): every run of a container the status shows, keyed by its
  `startedAt` (`state.running`, `state.terminated`, `lastState.terminated`), with its
  `finishedAt` once known.

Records are keyed per pod UID and merged as a join-semilattice (`merge`): runs are a union by
start time, a run's finish once known is kept, the share is the largest seen. So a record is a
function of the pod's own timestamps, folding the same observation twice (or a stale one after
a newer one) changes nothing, and the order observations arrive in does not matter. Usage is
never an accumulated counter: it is computed (`usage`) as the overlap of each run with a time
window, so the usage of a period, and its split at a period boundary, follow from the records.

A run still open (the container is running) counts up to `now`; a pod being deleted counts its
open runs up to its `deletionTimestamp` at most (`PodRecord.deleted_at`, the earliest one seen:
a shortened grace period moves it earlier), the latest instant it may have run; a `finishedAt`
the status shows later is the run's real end and wins.

Budgets: `Budget` gives GPU-seconds per period (refilled at each period's end; periods are
`period_s` long from `anchor`), or, with `half_life_s`, a decayed usage instead of a hard
period: every GPU-second counts 2^(-age / half_life), so a namespace that stops using GPUs
recovers smoothly. `budget_state` says used, remaining, the period and whether the namespace is
over budget (used >= allowed): its new GPU pods then get the lower PriorityClass
(`core.admission.mutators.budget.budget_priority`).

Settling (lossless end-of-pod accounting): a pod that has ended (`ended`) is settled into the
namespace's durable `Settled` (its GPU-seconds in the current period and its UID, kept in the
GPUBudget status) before its finalizer is removed; settling a UID twice is a no-op, so a
keeper killed between the two writes counts nothing twice, and one killed before them loses
nothing (the finalizer keeps the pod). `namespace_used` = settled + the ledger's unsettled
pods. See docs/budgets.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import AssignmentError, CardShare, pod_assignment
from elastic_gpu.core.dra.pods import pod_claim_compute
from elastic_gpu.core.mig.profiles import card_fraction
from elastic_gpu.core.podlife import TERMINAL_PHASES
from elastic_gpu.core.request import RequestKind, pod_request_from_manifest
from elastic_gpu.core.resources import MILLI_PER_CARD, MigProfile, ResourceError

#: Seconds since the epoch (Kubernetes timestamps have whole seconds).
Seconds = int


class BudgetError(ValueError):
    """A pod or budget the ledger cannot read; the message names the field and value."""


def parse_time(value: Any, what: str) -> Seconds:
    """An RFC 3339 timestamp as the API writes it (`2026-11-24T04:05:06Z`) -> epoch seconds."""
    if not isinstance(value, str):
        raise BudgetError(f"{what}={value!r} is not an RFC 3339 timestamp")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise BudgetError(f"{what}={value!r} is not an RFC 3339 timestamp") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return math.floor(parsed.timestamp())


# --------------------------------------------------------------------------- shares


def card_share(share: CardShare) -> Fraction:
    """The compute of one card share, in cards: a MIG instance its card fraction by its
    profile's name (an assignment names no card model; a name means one size), else milli."""
    if share.mig_profile is not None:
        try:
            return card_fraction(MigProfile.parse(share.mig_profile))
        except ResourceError as err:
            raise BudgetError(f"assignment mig={share.mig_profile!r}: {err}") from None
    return Fraction(share.milli, MILLI_PER_CARD)


def container_shares(pod: Mapping[str, Any],
                     claims: Mapping[str, Mapping[str, Any]] | None = None
                     ) -> dict[str, Fraction]:
    """Each GPU container's compute share in cards (containers without a GPU are left out):
    from the assignment when the pod has one (claim-backed containers included), else from its
    request; plus, with `claims` (its namespace's ResourceClaims by name), what it holds through
    DRA claims (`core.dra.pods`). Raises `BudgetError` for an unreadable assignment or request."""
    out = _device_plugin_shares(pod)
    for name, held in (pod_claim_compute(pod, claims) if claims else {}).items():
        out[name] = out.get(name, Fraction(0)) + held
    return out


def _device_plugin_shares(pod: Mapping[str, Any]) -> dict[str, Fraction]:
    try:
        assignment = pod_assignment(pod)
    except AssignmentError as err:
        raise BudgetError(f"annotation {ann.ASSIGNMENT}: {err}") from None
    if assignment is not None:
        out: dict[str, Fraction] = {}
        for name, shares in assignment.containers.items():
            total = sum((card_share(s) for s in shares), Fraction(0))
            if total:
                out[name] = total
        return out
    try:
        request = pod_request_from_manifest(pod)
    except ResourceError as err:
        raise BudgetError(f"pod resources: {err}") from None
    out = {}
    for container in request.containers:
        if container.kind is RequestKind.MIG:
            assert container.mig_profile is not None
            value = container.cards * card_fraction(container.mig_profile)
        else:
            value = Fraction(container.total_milli, MILLI_PER_CARD)
        if value:
            out[container.name] = value
    return out


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Run:
    """One run of a container: `start` and, once it ended, `end` (None: still running)."""

    start: Seconds
    end: Seconds | None = None


@dataclass(frozen=True)
class ContainerRecord:
    share: Fraction
    #: start -> end (None: still running); a union by start time
    runs: Mapping[Seconds, Seconds | None] = field(default_factory=dict)


@dataclass(frozen=True)
class PodRecord:
    """What the ledger knows of one pod (keyed by its UID in a `Ledger`)."""

    uid: str
    namespace: str
    containers: Mapping[str, ContainerRecord] = field(default_factory=dict)
    #: the pod runs no more: its phase is Succeeded or Failed, or it is being deleted
    final: bool = False
    #: its earliest `deletionTimestamp` seen: no open run lasts past it
    deleted_at: Seconds | None = None

    def stop(self, end: Seconds | None) -> Seconds | None:
        """A run's end for usage: its own, else (still open) the deletion's, else None."""
        return end if end is not None else self.deleted_at


def _runs_of(status: Mapping[str, Any], where: str) -> dict[Seconds, Seconds | None]:
    runs: dict[Seconds, Seconds | None] = {}
    for key in ("state", "lastState"):
        state = status.get(key) or {}
        running = state.get("running")
        if key == "state" and isinstance(running, Mapping) and running.get("startedAt"):
            start = parse_time(running["startedAt"], f"{where}.{key}.running.startedAt")
            runs.setdefault(start, None)
        terminated = state.get("terminated")
        if isinstance(terminated, Mapping) and terminated.get("startedAt"):
            start = parse_time(terminated["startedAt"], f"{where}.{key}.terminated.startedAt")
            end = parse_time(terminated.get("finishedAt"), f"{where}.{key}.terminated.finishedAt")
            runs[start] = max(end, start)
    return runs


def container_runs(pod: Mapping[str, Any]) -> dict[str, dict[Seconds, Seconds | None]]:
    """Every run of each container that the pod's status shows, by container name (a
    sidecar's status is among `initContainerStatuses`; names are unique across both)."""
    status: Mapping[str, Any] = pod.get("status") or {}
    out: dict[str, dict[Seconds, Seconds | None]] = {}
    for key in ("containerStatuses", "initContainerStatuses"):
        for index, cstatus in enumerate(status.get(key) or []):
            if isinstance(cstatus, Mapping):
                out[str(cstatus.get("name", ""))] = _runs_of(cstatus, f"status.{key}[{index}]")
    return out


def observe(pod: Mapping[str, Any],
            claims: Mapping[str, Mapping[str, Any]] | None = None) -> PodRecord | None:
    """The record one observation of a pod gives (None: not a GPU pod, or no UID); `claims`:
    its namespace's ResourceClaims by name (`container_shares`). A pod with a
    `deletionTimestamp` runs no later than it (`deleted_at`)."""
    meta: Mapping[str, Any] = pod.get("metadata") or {}
    uid = meta.get("uid")
    if not isinstance(uid, str) or not uid:
        return None
    shares = container_shares(pod, claims)
    if not shares:
        return None
    runs = container_runs(pod)
    phase = (pod.get("status") or {}).get("phase")
    record = PodRecord(uid, str(meta.get("namespace") or "default"), {
        name: ContainerRecord(share, runs.get(name, {})) for name, share in sorted(shares.items())},
        final=phase in TERMINAL_PHASES or bool(meta.get("deletionTimestamp")),
        deleted_at=parse_time(meta["deletionTimestamp"], "metadata.deletionTimestamp")
        if meta.get("deletionTimestamp") else None)
    return record


def _merge_runs(a: Mapping[Seconds, Seconds | None],
                b: Mapping[Seconds, Seconds | None]) -> dict[Seconds, Seconds | None]:
    out = dict(a)
    for start, end in b.items():
        known = out.get(start)
        if start not in out or known is None:
            out[start] = end
        elif end is not None:
            out[start] = max(known, end)
    return dict(sorted(out.items()))


def merge(a: PodRecord, b: PodRecord) -> PodRecord:
    """Two observations of one pod as one record: commutative, associative and idempotent."""
    if a.uid != b.uid:
        raise BudgetError(f"cannot merge records of pods {a.uid!r} and {b.uid!r}")
    containers: dict[str, ContainerRecord] = {}
    for name in sorted(set(a.containers) | set(b.containers)):
        x, y = a.containers.get(name), b.containers.get(name)
        if x is None or y is None:
            only = x if x is not None else y
            assert only is not None
            containers[name] = only
            continue
        containers[name] = ContainerRecord(max(x.share, y.share), _merge_runs(x.runs, y.runs))
    deleted = [d for d in (a.deleted_at, b.deleted_at) if d is not None]
    return PodRecord(a.uid, min(a.namespace, b.namespace), containers, a.final or b.final,
                     min(deleted) if deleted else None)


def replace_runs(record: PodRecord, fn: Callable[[Mapping[Seconds, Seconds | None]],
                                               Mapping[Seconds, Seconds | None]]) -> PodRecord:
    """The record with each container's runs replaced by `fn` of them."""
    return PodRecord(record.uid, record.namespace, {
        name: ContainerRecord(c.share, fn(c.runs)) for name, c in record.containers.items()},
        record.final, record.deleted_at)


#: pod UID -> record
Ledger = Mapping[str, PodRecord]


def fold(ledger: Ledger, record: PodRecord | None) -> dict[str, PodRecord]:
    """The ledger with one more observation merged in (a copy; None changes nothing)."""
    out = dict(ledger)
    if record is not None:
        known = out.get(record.uid)
        out[record.uid] = record if known is None else merge(known, record)
    return out


def fold_all(records: Iterable[PodRecord | None], ledger: Ledger | None = None) -> dict[str, PodRecord]:
    out = dict(ledger or {})
    for record in records:
        out = fold(out, record)
    return out


# --------------------------------------------------------------------------- usage


def _overlap(start: Seconds, end: Seconds | None, lo: Seconds, hi: Seconds, now: Seconds) -> int:
    stop = now if end is None else end
    return max(0, min(stop, hi, now) - max(start, lo))


def record_usage(record: PodRecord, lo: Seconds, hi: Seconds, now: Seconds) -> Fraction:
    """GPU-seconds (card-seconds) the pod used in [lo, hi), counting open runs up to `now`."""
    total = Fraction(0)
    for container in record.containers.values():
        seconds = sum(_overlap(s, record.stop(e), lo, hi, now)
                      for s, e in container.runs.items())
        total += container.share * seconds
    return total


def usage(ledger: Ledger, lo: Seconds, hi: Seconds, now: Seconds) -> dict[str, Fraction]:
    """GPU-seconds per namespace in [lo, hi) (namespaces with no record are absent)."""
    out: dict[str, Fraction] = {}
    for record in ledger.values():
        used = record_usage(record, lo, hi, now)
        if used:
            out[record.namespace] = out.get(record.namespace, Fraction(0)) + used
    return out


def decayed_usage(ledger: Ledger, half_life_s: int, now: Seconds) -> dict[str, float]:
    """GPU-seconds per namespace, each second weighted 2^(-(now - t) / half_life): the integral
    of share x 2^(-(now-t)/h) over every run up to `now`."""
    if half_life_s <= 0:
        raise BudgetError(f"halfLife={half_life_s}s must be positive")
    k = math.log(2) / half_life_s
    out: dict[str, float] = {}
    for record in ledger.values():
        total = 0.0
        for container in record.containers.values():
            for start, end in container.runs.items():
                end = record.stop(end)
                stop = min(now, now if end is None else end)
                if stop <= start:
                    continue
                total += float(container.share) * (math.exp(-k * (now - stop))
                                                   - math.exp(-k * (now - start))) / k
        if total:
            out[record.namespace] = out.get(record.namespace, 0.0) + total
    return out


def prune(ledger: Ledger, before: Seconds) -> dict[str, PodRecord]:
    """The ledger without the pods whose every run ended before `before` (they add nothing to
    a period starting there; observing such a pod again re-adds a record that still adds
    nothing)."""
    return {uid: r for uid, r in ledger.items()
            if any((stop := r.stop(e)) is None or stop > before
                   for c in r.containers.values() for e in c.runs.values())}


# --------------------------------------------------------------------------- budgets


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


def budget_state(budget: Budget, ledger: Ledger, namespace: str, now: Seconds) -> BudgetState:
    """Used and remaining GPU-seconds of `namespace` now, and whether it is over budget.

    With a hard period: the usage in the current period (a pod running across the boundary
    counts only its part after it: the budget refills at the period's end). With a half-life:
    the decayed usage; the period then only says when the status is refreshed."""
    start, end = period_bounds(budget, now)
    used: Fraction | float
    if budget.half_life_s is not None:
        scoped = {u: r for u, r in ledger.items() if r.namespace == namespace}
        used = decayed_usage(scoped, budget.half_life_s, now).get(namespace, 0.0)
    else:
        scoped = {u: r for u, r in ledger.items() if r.namespace == namespace}
        used = usage(scoped, start, end, now).get(namespace, Fraction(0))
    remaining = max(budget.gpu_seconds - used, 0)
    return BudgetState(used, remaining, start, end, used >= budget.gpu_seconds)


# --------------------------------------------------------------------------- priority


@dataclass(frozen=True)
class PriorityDowngrade:
    """What the mutating webhook gives a GPU pod of an over-budget namespace: the lower
    PriorityClass and its value (the apiserver's Priority plugin ran before the webhooks, so
    `spec.priority` must be set to match), and its preemptionPolicy when it has one."""

    priority_class: str
    priority: int
    preemption_policy: str | None = None


@dataclass(frozen=True)
class NamespaceBudget:
    """What the mutating webhook knows of a pod's namespace's GPU budget."""

    #: the namespace has a GPUBudget (or that cannot be told): its GPU pods get the keeper's
    #: `FINALIZER`, so their usage is settled losslessly; a namespace without one gets none,
    #: so no deleted pod of it waits for `egpu controller` (issue #26)
    budgeted: bool = False
    #: the lower PriorityClass while the namespace is over budget
    downgrade: PriorityDowngrade | None = None


def downgrade_for(state: BudgetState | None, lower: PriorityDowngrade) -> PriorityDowngrade | None:
    """The downgrade a namespace's new GPU pods get: `lower` while it is over budget; None in
    budget or without a budget."""
    return lower if state is not None and state.over else None


# --------------------------------------------------------------------------- settling


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


# --------------------------------------------------------------------------- the keeper

#: The finalizer that holds a GPU pod until its usage is settled (added by the webhook at
#: CREATE, or by the keeper to a GPU pod of a budgeted namespace that lacks it).
FINALIZER = "elasticgpu.io/budget"


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
                        used >= budget.gpu_seconds)
    release = frozenset(u for u in settled.uids if u in ledger)
    return NamespacePlan(settled, state, release, settled != stored)


def burn_rate(ledger: Ledger, namespace: str) -> Fraction:
    """Cards the namespace's running containers hold now (GPU-seconds per second)."""
    return sum((c.share for r in ledger.values() if r.namespace == namespace and not r.final
                for c in r.containers.values()
                if any(r.stop(e) is None for e in c.runs.values())), Fraction(0))


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
