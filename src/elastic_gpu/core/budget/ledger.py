"""The GPU-time ledger: what the API says of each GPU pod, kept per pod UID.

The time (`container_runs`): every run of a container the status shows, keyed by its
`startedAt` (`state.running`, `state.terminated`, `lastState.terminated`), with its
`finishedAt` once known.

Records are merged as a join-semilattice (`merge`): runs are a union by start time, a run's
finish once known is kept, the share is the largest seen. So a record is a function of the
pod's own timestamps, folding the same observation twice (or a stale one after a newer one)
changes nothing, and the order observations arrive in does not matter.

A run still open (the container is running) counts up to `now`; a pod being deleted counts its
open runs up to its `deletionTimestamp` at most (`PodRecord.deleted_at`, the earliest one seen:
a shortened grace period moves it earlier), the latest instant it may have run; a `finishedAt`
the status shows later is the run's real end and wins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from elastic_gpu.core.budget.errors import BudgetError
from elastic_gpu.core.budget.shares import container_shares
from elastic_gpu.core.budget.timestamps import Seconds, parse_time
from elastic_gpu.core.podlife import TERMINAL_PHASES


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

