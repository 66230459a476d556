"""The defragmentation controller: its informers and the round (see the package docstring).

One level-triggered round at a time (a single work-queue key), run on every change and every
`RESYNC_S` seconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from elastic_gpu.controller.config import DefragConfig, DefragMode
from elastic_gpu.controller.defrag.cluster import Cluster, read_cluster
from elastic_gpu.controller.defrag.metrics import DefragMetrics
from elastic_gpu.controller.defrag.state import DefragState, InFlight
from elastic_gpu.controller.defrag.writes import DefragWrites, Step
from elastic_gpu.controller.manager import Context
from elastic_gpu.controller.worker import Done, Outcome, run_rounds
from elastic_gpu.core.claims.pods import ClaimAnnotationError, pod_claims
from elastic_gpu.core.defrag.limits import RateLimits, over_limit
from elastic_gpu.core.defrag.movable import (
    MoveRules,
    PodFacts,
    pod_facts,
    waiting_for_capacity,
    why_not_movable,
)
from elastic_gpu.core.defrag.plan import DefragPlan, plan_moves
from elastic_gpu.core.nodeaffinity import RulesError, refusal, rules_from_manifest, taints_from_node
from elastic_gpu.core.placement import Unschedulable
from elastic_gpu.core.request import PodRequest, pod_request_from_manifest
from elastic_gpu.core.resources import ResourceError
from elastic_gpu.kube.informer import on_any_change
from elastic_gpu.kube.resources import ELASTICGPUS, GPUDEVICES, NODES, PODS
from elastic_gpu.kube.workqueue import WorkQueue

log = logging.getLogger(__name__)

ROUND = "round"
#: how often a round runs with nothing changing (cool-downs and settling end by time)
RESYNC_S = 5.0


def _created(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("creationTimestamp") or "")


class DefragController:
    name = "defrag"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.config: DefragConfig = ctx.config.defrag
        self.queue: WorkQueue[str] = WorkQueue(ctx.new_backoff())
        f = ctx.informers
        self.pods = f.informer(PODS.path(), "pods")
        self.nodes = f.informer(NODES.path(), "nodes")
        self.devices = f.informer(GPUDEVICES.path(), "gpudevices", missing_ok=True)
        self.egpus = f.informer(ELASTICGPUS.path(), "elasticgpus", missing_ok=True)
        self.state = DefragState()
        #: the reservation's expiry is wall-clock time (the extender reads it, another process)
        self.wall_clock = time.time
        self.metrics = DefragMetrics(ctx)
        self.writes = DefragWrites(ctx.client, ctx.recorder, self.state, self.metrics)
        self.limits = RateLimits(self.config.max_moves_per_node, self.config.max_moves_cluster,
                                 self.config.rate_window_s)
        self.rules = MoveRules(self.config.movable_namespaces, self.config.cool_down_s)
        if self.config.enabled:  # off: not even woken up
            changed = on_any_change(self.kick)
            for informer in (self.pods, self.nodes, self.devices, self.egpus):
                informer.add_handler(changed)

    def kick(self) -> None:
        self.queue.add(ROUND)

    async def run(self, workers: int) -> None:
        del workers  # one round at a time
        await run_rounds(self.queue, self.name, self.ctx.metrics, self._round_key, self.kick,
                         describe="defrag round", off=None if self.config.enabled else
                         "defrag: off (defrag.enabled is false in --config)")

    async def _round_key(self, key: str) -> Outcome:
        del key  # the one key: a round over the whole cluster
        await self.round(time.monotonic())
        return Done(after=RESYNC_S)

    # ------------------------------------------------------------------ the round

    def _settled(self, pods: Sequence[Mapping[str, Any]], now: float) -> bool:
        """Whether no plan is in flight (the last one's pending pod is bound, gone, or its
        time is up)."""
        flight = self.state.in_flight
        if flight is None:
            return True
        for pod in pods:
            facts = pod_facts(pod)
            if facts.key == flight.pending_key and facts.uid == flight.pending_uid \
                    and not facts.node and now < flight.deadline:
                return False
        self.state.in_flight = None
        return True

    def _waiting(self, pods: Sequence[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any],
                                                                          PodRequest]]:
        """Pods waiting for GPU capacity in a namespace the configuration governs, most
        important (then oldest) first. A pod using an ElasticGPUClaim waits for its claim,
        not for cards: it is left out."""
        out = []
        for pod in pods:
            if not waiting_for_capacity(pod):
                continue
            facts = pod_facts(pod)
            if not self.config.governs(facts.namespace):
                continue
            try:
                if pod_claims(pod):
                    continue
                request = pod_request_from_manifest(pod)
            except (ClaimAnnotationError, ResourceError, ValueError):
                continue
            if request.wants_gpu:
                out.append((pod, request))
        out.sort(key=lambda item: (-pod_facts(item[0]).priority, _created(item[0])))
        return out

    def _movable(self, cluster: Cluster, pending: PodFacts, now: float
                 ) -> dict[str, PodRequest]:
        memory = self.state.memory()
        return {key: placed.request for key, placed in cluster.placed.items()
                if why_not_movable(placed.facts, holds_cards=True, uses_claim=placed.uses_claim,
                                   pending_priority=pending.priority, rules=self.rules,
                                   memory=memory, now=now) is None}

    async def round(self, now: float) -> None:
        if not self.config.enabled:
            return
        self.state.forget_old(now, self.config.cool_down_s, self.limits)
        pods = self.pods.items()
        if not self._settled(pods, now):
            return
        waiting = self._waiting(pods)
        self.metrics.pending.set(len(waiting))
        live = {pod_facts(p).key for p, _ in waiting}
        self.state.recorded = {k: v for k, v in self.state.recorded.items() if k in live}
        if not waiting:
            return
        cluster = read_cluster(self.devices.items(), self.nodes.items(), pods,
                               self.egpus.items(), self.config.policy)
        seen: list[Mapping[str, Any]] = []
        planned: set[str] = set()
        await self._serve(cluster, waiting, now, seen, planned)
        for pod in seen:  # plan records no plan backs any more (`egpu top` shows them)
            key = pod_facts(pod).key
            if key in self.state.recorded and key not in planned:
                await self.writes.forget_record(pod, key)

    async def _serve(self, cluster: Cluster, waiting: Sequence[tuple[Mapping[str, Any],
                                                                    PodRequest]],
                     now: float, seen: list[Mapping[str, Any]], planned: set[str]) -> None:
        """Plan for the waiting pods in order: report each plan, or carry out the first that
        passes the rate limits (one per round). `seen`: the pods looked at; `planned`: those
        a plan was found for (its record stands)."""
        for pod, request in waiting:
            facts = pod_facts(pod)
            seen.append(pod)
            if _fits_now(cluster, request):
                continue  # it fits as things are: the scheduler's to place, nothing to move
            movable = self._movable(cluster, facts, now)
            if not movable:
                continue
            plan = plan_moves(cluster.engine, facts.key, request, movable,
                              self.config.max_moves, policy=self.config.policy)
            if plan is None or not plan.moves:
                continue
            steps = self._steps(cluster, plan)
            off_limits = self._off_limits(pod, plan, steps)
            if off_limits is not None:
                log.info("defrag for %s: plan not used: %s", facts.key, off_limits)
                continue
            planned.add(facts.key)
            if self.config.mode is DefragMode.REPORT:
                self.metrics.plans.labels("reported").inc()
                await self.writes.report(pod, facts.key, steps, plan.placement,
                                         self.wall_clock())
                continue
            why = over_limit([s.source.node for s in steps], self.state.evictions, now,
                             self.limits)
            if why is not None:
                self.metrics.plans.labels("rate_limited").inc()
                self.writes.rate_limited(pod, why)
                continue
            if not await self.writes.reserve(pod, facts.key, steps, plan.placement,
                                             self.wall_clock(), self.config.reservation_s):
                return  # the next round tries again
            self.metrics.plans.labels("carried_out").inc()
            done = await self.writes.carry_out(pod, facts.key, steps, plan.placement, now)
            if done:
                self.state.in_flight = InFlight(facts.key, facts.uid,
                                                now + self.config.settle_s)
            return  # one plan per round: the next one reads the cluster as it is then

    def _off_limits(self, pending: Mapping[str, Any], plan: DefragPlan, steps: Sequence[Step]
                    ) -> str | None:
        """Why kube-scheduler would not follow the plan (the Engine does not model node
        selectors, affinity or taints): a pod it puts on a node its rules refuse."""
        nodes = {str((n.get("metadata") or {}).get("name")): n for n in self.nodes.items()}
        wanted = [(pending, plan.placement.node)] + [(s.obj, s.target.node) for s in steps]
        for obj, node_name in wanted:
            node = nodes.get(node_name, {})
            labels = (node.get("metadata") or {}).get("labels") or {}
            try:
                why = refusal(rules_from_manifest(obj), node_name, labels, taints_from_node(node))
            except RulesError as err:
                why = str(err)
            if why is not None:
                return f"{pod_facts(obj).key} on {node_name}: {why}"
        return None

    @staticmethod
    def _steps(cluster: Cluster, plan: DefragPlan) -> list[Step]:
        return [Step(cluster.placed[m.pod_key].obj, cluster.placed[m.pod_key].facts,
                     m.source, m.target) for m in plan.moves]


def _fits_now(cluster: Cluster, request: PodRequest) -> bool:
    """Whether the engine places the pod on the cluster as it is (no move needed)."""
    try:
        cluster.engine.place(request)
    except Unschedulable:
        return False
    return True
