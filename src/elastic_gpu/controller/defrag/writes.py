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


def cards(assignment: Assignment) -> str:
    """`node n1 card 0,1`; MIG instances are named with their profile: `node n1 card 0
    (MIG 3g.40gb MIG-a1b2)`, since a move between instances may stay on one card index."""
    indexes = sorted({s.index for s in assignment.shares()})
    text = f"node {assignment.node} card{'s' if len(indexes) > 1 else ''} " \
           f"{','.join(str(i) for i in indexes)}"
    mig = sorted((s.mig_profile or "", s.mig_uuid) for s in assignment.shares()
                 if s.mig_uuid is not None)
    if mig:
        text += f" (MIG {', '.join(f'{profile} {uuid}' for profile, uuid in mig)})"
    return text


@dataclass(frozen=True)
class Step:
    """One move of a plan, with the pod it moves."""

    obj: Mapping[str, Any]
    facts: PodFacts
    source: Assignment
    target: Assignment

    def describe(self) -> str:
        return f"{self.facts.key} from {cards(self.source)} to {cards(self.target)}"


def describe_plan(steps: Sequence[Step], placement: Assignment) -> str:
    moves = "; ".join(s.describe() for s in steps)
    return f"move {len(steps)} pod(s): {moves}; then this pod fits on {cards(placement)}"


class DefragWrites:
    def __init__(self, client: KubeClient, recorder: EventRecorder, state: DefragState,
                 metrics: DefragMetrics) -> None:
        self.client = client
        self.recorder = recorder
        self.state = state
        self.metrics = metrics

    def report(self, pending: Mapping[str, Any], key: str, steps: Sequence[Step],
               placement: Assignment) -> None:
        text = describe_plan(steps, placement)
        self.recorder.record(pending, "Normal", PLANNED, f"report mode, nothing moved: would {text}")
        if self.state.reported.get(key) != text:
            self.state.reported[key] = text
            log.info("defrag plan for %s (report mode, nothing moved): %s", key, text)

    def rate_limited(self, pending: Mapping[str, Any], why: str) -> None:
        self.recorder.record(pending, "Normal", RATE_LIMITED, f"room could be made, but {why}")

    async def reserve(self, pending: Mapping[str, Any], key: str, placement: Assignment,
                      wall_now: float, ttl_s: float) -> bool:
        """Write the plan's reservation on the pending pod (`core.defrag.reservation`), before
        anything is evicted: the extender keeps the freed cards for it. False (and nothing is
        evicted) when the write fails: room made without it may go to another pod."""
        meta = pending.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
        text = reservation_for(placement, wall_now, ttl_s).to_json()
        patch = {"metadata": {"uid": meta.get("uid"), "annotations": {ann.DEFRAG_RESERVATION: text}}}
        try:
            await self.client.patch(PODS.path(namespace, name), patch)
        except ApiError as err:
            log.warning("defrag for %s: reserving %s: %s", key, cards(placement), err)
            self.recorder.record(pending, "Warning", RESERVE_FAILED,
                                 f"reserving {cards(placement)} failed, nothing moved: {err}")
            return False
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
                                 f"the plan puts it on {cards(step.target)}")
            self.recorder.record(pending, "Normal", MADE_ROOM,
                                 f"evicted {step.describe()} to make room on {cards(placement)}")
        return done
