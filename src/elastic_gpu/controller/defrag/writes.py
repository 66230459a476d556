"""Every write of the defragmentation controller: evictions (policy/v1, so PodDisruptionBudgets
hold) and the Events that tell them.

An eviction the API answers with 429 is a PodDisruptionBudget's refusal: it is recorded (an
Event on both pods, the pod remembered as refused for the cool-down) and not retried; the rest
of the plan is dropped (half a plan frees nothing).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elastic_gpu.controller.defrag.metrics import DefragMetrics
from elastic_gpu.controller.defrag.state import DefragState
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.defrag.limits import Eviction
from elastic_gpu.core.defrag.movable import PodFacts
from elastic_gpu.core.defrag.record import (
    PlannedMove,
    PlanRecord,
    describe_cards,
    plan_record,
)
from elastic_gpu.core.defrag.reservation import reservation_for
from elastic_gpu.kube.client import KubeClient
from elastic_gpu.kube.errors import ApiError, NotFound, TooManyRequests
from elastic_gpu.kube.events import EventRecorder
from elastic_gpu.kube.resources import PODS

log = logging.getLogger(__name__)

#: Event reasons (docs/defrag.md lists them)
PLANNED = "DefragPlanned"
MOVED = "DefragMoved"
MADE_ROOM = "DefragMadeRoom"
REFUSED = "DefragEvictionRefused"
RATE_LIMITED = "DefragRateLimited"
FAILED = "DefragEvictionFailed"
RESERVE_FAILED = "DefragReservationFailed"


@dataclass(frozen=True)
class Step:
    """One move of a plan, with the pod it moves."""

    obj: Mapping[str, Any]
    facts: PodFacts
    source: Assignment
    target: Assignment

    def planned(self) -> PlannedMove:
        return PlannedMove(self.facts.key, self.source, self.target)

    def describe(self) -> str:
        return self.planned().describe()


def record_of(mode: str, steps: Sequence[Step], placement: Assignment, wall_now: float
              ) -> PlanRecord:
    return plan_record(mode, wall_now, placement, [s.planned() for s in steps])


def describe_plan(steps: Sequence[Step], placement: Assignment) -> str:
    return record_of("report", steps, placement, 0.0).describe()


class DefragWrites:
    def __init__(self, client: KubeClient, recorder: EventRecorder, state: DefragState,
                 metrics: DefragMetrics) -> None:
        self.client = client
        self.recorder = recorder
        self.state = state
        self.metrics = metrics

    async def report(self, pending: Mapping[str, Any], key: str, steps: Sequence[Step],
                     placement: Assignment, wall_now: float) -> None:
        """The Event, and for a plan that changed the log line and the plan record on the pod
        (`egpu top` shows it). A failed record write is logged; the next change tries again."""
        record = record_of("report", steps, placement, wall_now)
        text = record.describe()
        self.recorder.record(pending, "Normal", PLANNED, f"report mode, nothing moved: would {text}")
        if self.state.recorded.get(key) == text:
            return
        log.info("defrag plan for %s (report mode, nothing moved): %s", key, text)
        if await self._annotate(pending, key, {ann.DEFRAG_PLAN: record.to_json()}):
            self.state.recorded[key] = text

    async def forget_record(self, pending: Mapping[str, Any], key: str) -> None:
        """The pod has no plan any more (it fits as things are, nothing would make room, or a
        plan carried out was refused): its plan record is removed, so `egpu top` does not show
        a stale one."""
        if await self._annotate(pending, key, {ann.DEFRAG_PLAN: None}):
            self.state.recorded.pop(key, None)

    async def _annotate(self, pending: Mapping[str, Any], key: str,
                        notes: Mapping[str, str | None]) -> bool:
        """A merge patch of the pending pod's annotations, for this very pod (its uid)."""
        meta = pending.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
        patch = {"metadata": {"uid": meta.get("uid"), "annotations": dict(notes)}}
        try:
            await self.client.patch(PODS.path(namespace, name), patch)
        except ApiError as err:
            log.warning("defrag for %s: writing %s: %s", key, ", ".join(notes), err)
            return False
        return True

    def rate_limited(self, pending: Mapping[str, Any], why: str) -> None:
        self.recorder.record(pending, "Normal", RATE_LIMITED, f"room could be made, but {why}")

    async def reserve(self, pending: Mapping[str, Any], key: str, steps: Sequence[Step],
                      placement: Assignment, wall_now: float, ttl_s: float) -> bool:
        """Write the plan's reservation on the pending pod (`core.defrag.reservation`), before
        anything is evicted: the extender keeps the freed cards for it; and in the same patch
        the plan record (`egpu top` shows it). False (and nothing is evicted) when the write
        fails: room made without it may go to another pod."""
        meta = pending.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
        record = record_of("move", steps, placement, wall_now)
        notes = {ann.DEFRAG_RESERVATION: reservation_for(placement, wall_now, ttl_s).to_json(),
                 ann.DEFRAG_PLAN: record.to_json()}
        patch = {"metadata": {"uid": meta.get("uid"), "annotations": notes}}
        try:
            await self.client.patch(PODS.path(namespace, name), patch)
        except ApiError as err:
            log.warning("defrag for %s: reserving %s: %s", key, describe_cards(placement), err)
            self.recorder.record(pending, "Warning", RESERVE_FAILED,
                                 f"reserving {describe_cards(placement)} failed, nothing moved: {err}")
            return False
        self.state.recorded[key] = record.describe()
        return True

    async def carry_out(self, pending: Mapping[str, Any], key: str, steps: Sequence[Step],
                        placement: Assignment, now: float) -> int:
        """Evict the plan's pods in order; the number evicted (the rest is dropped at the
        first refusal or failure)."""
        log.info("defrag for %s: %s", key, describe_plan(steps, placement))
        done = 0
        for step in steps:
            facts = step.facts
            body = {"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": facts.name, "namespace": facts.namespace},
                    "deleteOptions": {"preconditions": {"uid": facts.uid}}}
            try:
                await self.client.create(PODS.path(facts.namespace, facts.name, "eviction"), body)
            except TooManyRequests as err:
                self.metrics.evictions.labels("refused").inc()
                self.state.refused_at[facts.uid] = now
                text = (f"eviction of {facts.key} refused (a PodDisruptionBudget: {err}); it is "
                        "left alone for the cool-down")
                log.info("defrag for %s: %s", key, text)
                self.recorder.record(pending, "Warning", REFUSED, text)
                self.recorder.record(step.obj, "Warning", REFUSED,
                                     f"not moved to make room for {key}: {err}")
                return done
            except NotFound:
                log.info("defrag for %s: %s is gone already", key, facts.key)
                return done
            except ApiError as err:
                self.metrics.evictions.labels("failed").inc()
                log.warning("defrag for %s: evicting %s: %s", key, facts.key, err)
                self.recorder.record(pending, "Warning", FAILED,
                                     f"evicting {facts.key} failed: {err}")
                return done
            done += 1
            self.metrics.evictions.labels("moved").inc()
            if facts.owner is not None:
                self.state.moved_at[facts.owner.uid] = now
            self.state.evictions.append(Eviction(now, step.source.node))
            owner = facts.owner.kind if facts.owner is not None else "owner"
            self.recorder.record(step.obj, "Normal", MOVED,
                                 f"evicted to make room for {key}: its {owner} re-creates it; "
                                 f"the plan puts it on {describe_cards(step.target)}")
            self.recorder.record(pending, "Normal", MADE_ROOM,
                                 f"evicted {step.describe()} to make room on {describe_cards(placement)}")
        return done
