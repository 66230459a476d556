"""The scheduling questions: filter, prioritize and preempt, asked of the engine under the lock;
and choosing the cards of a bind (`reserve`), which the ledger then holds.

The preemption victim search itself is a decision over core types (`core.preemption`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from typing import Protocol

import numpy as np

from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.fit import FitFailure, FitKind
from elastic_gpu.core.placement import (
    FilterResult,
    ScoredNodes,
)
from elastic_gpu.core.preemption import victims_on
from elastic_gpu.core.request import PodRequest
from elastic_gpu.scheduler.state.handle import StateHandle

log = logging.getLogger(__name__)

#: Failed nodes explained one by one per filter call; the rest share `SUMMARY_FAILURE`.
DETAIL_LIMIT = 16
SUMMARY_FAILURE = FitFailure(FitKind.UNDETAILED)
UNKNOWN_NODE_FAILURE = FitFailure(FitKind.UNKNOWN_NODE)


class CatchUp(Protocol):
    """What placement asks of the inventory (`Inventory`): the engine's nodes up to date."""

    def flush(self) -> None: ...


class Holdings(Protocol):
    """What placement asks of the ledger (`Ledger`)."""

    def held(self, uid: str) -> Assignment | None: ...

    def holds_view(self) -> Mapping[str, Assignment]: ...

    def reserved_node(self, uid: str) -> str | None: ...

    def preemptible_residents(self, node: str) -> dict[str, int]: ...

    def priority_of(self, uid: str) -> int: ...

    def expire(self) -> int: ...

    def defrag_hold_released(self, uid: str) -> AbstractContextManager[None]: ...

    def reserve_assignment(self, pod: PodRequest, uid: str, node: str,
                           assignment: Assignment) -> int: ...


class Workload(Protocol):
    """What placement asks of the pods' usage (`PodUsage`): the observed workload current."""

    def refresh_workload(self) -> None: ...


class Turnaways(Protocol):
    """What placement tells the pods waiting for capacity (`Wakeups`)."""

    def note_filtered(self, pod: PodRequest, uid: str, node_names: Sequence[str],
                      feasible: Sequence[str], priority: Callable[[], int]) -> None: ...


class Placement:
    """filter, prioritize, preempt; and the cards of a bind."""

    def __init__(self, handle: StateHandle, inventory: CatchUp, ledger: Holdings,
                 workload: Workload, turnaways: Turnaways) -> None:
        self._h = handle
        self._inventory = inventory
        self._ledger = ledger
        self._workload = workload
        self._turnaways = turnaways
        #: the last scoring of a filter (uid, pod, version, scores), for the prioritize that
        #: follows it while nothing changed
        self._last_scores: tuple[str, PodRequest, int, ScoredNodes] | None = None

    @contextmanager
    def _without(self, uid: str) -> Iterator[None]:
        """What-if: the engine as if this pod held nothing (a pod being re-placed may move)."""
        held = self._ledger.held(uid)
        if held is None:
            yield
            return
        self._h.engine.release(uid)
        try:
            yield
        finally:
            self._h.engine.allocate(uid, held)

    def prepare(self) -> None:
        """Before a decision: ready, the engine's nodes, workload and reservations current."""
        self._h.require_ready()
        self._inventory.flush()
        self._workload.refresh_workload()
        self._ledger.expire()

    def reserve(self, pod: PodRequest, uid: str, node: str) -> tuple[int, Assignment]:
        """Choose cards on `node` and hold them now, before anything is written to the API.

        Returns a token for `settle`. Earlier reservations and holds of the same pod stay
        counted: until their outcome is known, any one of them may be the one that lands.
        """
        with self._h.lock:
            self.prepare()
            with self._ledger.defrag_hold_released(uid):
                assignment = self._h.engine.assign(pod, node)
                return self._ledger.reserve_assignment(pod, uid, node, assignment), assignment

    def filter(self, pod: PodRequest, uid: str, node_names: Sequence[str], *,
               reasons_if_fit: bool = True, narrow: bool | None = None) -> FilterResult:
        """Which nodes can take the pod, and why each other one cannot (`_filter`); a GPU pod
        that fits none of them is remembered as waiting for capacity (`wakeups`).
        `reasons_if_fit=False`: no reasons when some node fits (the HTTP filter's answer
        leaves them out then, as kube-scheduler reads them only when none fits), so a
        request past `DETAIL_LIMIT` nodes explains no failed node when one fits.
        `narrow`: answer only the engine's choice when a node fits (`filterResult: best`, or
        `auto`'s verdict for this pod, `scheduler.narrowing`); None: as the configuration's
        `filterResult` says of every pod (`best` narrows; `all` and `auto` do not: `auto`
        needs the pod's manifest, which the verb has).

        The failed nodes past `DETAIL_LIMIT` share a summary reason, filled in after the lock
        is released: on a request naming 20,000 nodes that loop is most of the call, and other
        requests (small filters, binds) must not wait behind it."""
        with self._h.lock:
            if narrow is None:
                narrow = self._h.config.filter_result == "best"
            result, overflow = self._filter(pod, uid, node_names, reasons_if_fit, narrow)
            self._turnaways.note_filtered(pod, uid, node_names, result.feasible,
                                          lambda: self._ledger.priority_of(uid))
            known = self._h.known  # a frozenset, replaced whole when nodes change
        if not overflow:
            return result
        failed = dict(result.failed)
        for name in overflow:
            failed[name] = SUMMARY_FAILURE if name in known else UNKNOWN_NODE_FAILURE
        return FilterResult(result.feasible, failed)

    def _filter(self, pod: PodRequest, uid: str, node_names: Sequence[str],
                reasons_if_fit: bool, narrow: bool) -> tuple[FilterResult, Sequence[str]]:
        """Which nodes can take the pod, and why each other one cannot.

        The engine explains a failed node by planning its cards, which costs about 0.1 ms per
        node: on a full 5,000-node cluster that is most of a second per pod (kube-scheduler
        only shows a count per distinct reason anyway). Past
        `DETAIL_LIMIT` failed nodes, feasibility comes from the engine's vectorised fit (the
        nodes `score` keeps) and only the first `DETAIL_LIMIT` failures are explained; the
        others are returned apart, for `filter` to name outside the lock.
        """
        with self._h.lock:
            self.prepare()
            with self._without(uid):
                if narrow:
                    # Narrowed answer: only the node the engine would choose. kube-scheduler
                    # skips scoring (and prioritize) when one node is left, so the decision is
                    # exactly the engine's and the cycle has one round trip instead of two.
                    reserved = self._ledger.reserved_node(uid)
                    if reserved is not None and reserved in node_names \
                            and self._h.engine.filter(pod, [reserved]).feasible:
                        return FilterResult([reserved], {}), ()  # where room was made for it
                    best = self._h.engine.best(pod, node_names)
                    if best is not None:
                        return FilterResult([best], {}), ()
                if len(node_names) <= DETAIL_LIMIT:
                    return self._h.engine.filter(pod, node_names), ()
                scored = self._h.engine.scored(pod, node_names)
                # kube-scheduler asks prioritize next, for the nodes that passed: keep the
                # scores while nothing changes (one engine scoring per cycle, not two).
                self._last_scores = (uid, pod, self._h.version, scored)
                if scored.feasible and not reasons_if_fit:
                    return FilterResult(scored.feasible, {}), ()
                failed_names = scored.failed
                failed = dict(self._h.engine.filter(pod, failed_names[:DETAIL_LIMIT]).failed)
        return FilterResult(scored.feasible, failed), failed_names[DETAIL_LIMIT:]

    def prioritize(self, pod: PodRequest, uid: str, node_names: Sequence[str]) -> dict[str, int]:
        """Scores 0..10 (kube-scheduler's extender range), best node 10."""
        with self._h.lock:
            self.prepare()
            with self._without(uid):
                last = self._last_scores
                scored: ScoredNodes | None = None
                if last is not None and last[:3] == (uid, pod, self._h.version):
                    scored = last[3]
                    if scored.feasible != list(node_names):  # usually equal: the filter's answer
                        cached = scored.as_dict()
                        kept = [n for n in node_names if n in cached]
                        scored = ScoredNodes(kept, np.array([cached[n] for n in kept],
                                                            dtype=np.float64), [])
                elif pod.wants_gpu:
                    scored = self._h.engine.scored(pod, node_names)
            reserved = self._ledger.reserved_node(uid)
        if scored is None:
            return dict.fromkeys(node_names, 0)
        return prefer(rescale_scored(scored, node_names), reserved)

    def preempt(self, pod: PodRequest, uid: str,
                candidates: Mapping[str, tuple[Sequence[str], int]]) -> dict[str, tuple[list[str], int]]:
        """For each node, victims whose removal really frees the cards the pod needs
        (`core.preemption.victims_on`: kube-scheduler's victims, then lower-priority pods
        holding cards there). Nodes where it cannot fit are left out."""
        with self._h.lock:
            self.prepare()
            preemptor_priority = self._ledger.priority_of(uid)
            out: dict[str, tuple[list[str], int]] = {}
            with self._without(uid):
                for node, (victims, pdb) in candidates.items():
                    if node not in self._h.known:
                        continue
                    residents = self._ledger.preemptible_residents(node)
                    chosen = victims_on(self._h.engine, pod, node, list(victims),
                                        self._ledger.holds_view(), residents, preemptor_priority)
                    if chosen is not None:
                        out[node] = (chosen, pdb)
            return out


def without_containers(pod: PodRequest, containers: Iterable[str]) -> PodRequest:
    """The pod without some containers' GPU requests (claim-backed containers: their cards
    are their ElasticGPU's)."""
    drop = set(containers)
    if not drop:
        return pod
    return replace(pod, containers=tuple(c for c in pod.containers if c.name not in drop))


def prefer(scores: dict[str, int], node: str | None) -> dict[str, int]:
    """`node` first (kube-scheduler asks prioritize only for the nodes its filter passed): 10,
    every other at most 9."""
    if node is None or node not in scores:
        return scores
    out = {n: min(v, 9) for n, v in scores.items()}
    out[node] = 10
    return out


def rescale_scored(scored: ScoredNodes, node_names: Sequence[str]) -> dict[str, int]:
    """Engine scores (any range, higher better) -> kube-scheduler's 0..10, best node 10, on
    arrays (no Python loop over the nodes). Nodes without a score (unknown, or a pod without
    GPUs) get 0: they add nothing."""
    out = dict.fromkeys(node_names, 0)
    values = scored.scores
    if values.size == 0:
        return out
    low, high = float(values.min()), float(values.max())
    span = high - low
    if span <= 0:
        out.update(dict.fromkeys(scored.feasible, 10))
        return out
    scale = 10.0 / span
    # int() of a non-negative float truncates, as astype does
    out.update(zip(scored.feasible, ((values - low) * scale + 0.5).astype(np.int64).tolist(),
                   strict=True))
    return out
