"""bind: the Binding, written with the assignment annotations in one write, after the cards
are reserved in the state; and binding pods that name claims (a first consumer's ElasticGPU is
created before the Binding).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from aiohttp import web

from elastic_gpu.api import elasticgpu as egpu_api
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.claims import model as claims_model
from elastic_gpu.core.claims.blocks import describe_blocks
from elastic_gpu.core.claims.pods import ClaimAnnotationError, PodClaims, off_node_failure, pod_claims
from elastic_gpu.core.dra.nodemode import dra_fit_failure, extender_binds
from elastic_gpu.core.fit import describe
from elastic_gpu.core.nodeaffinity import RulesError, refusal, rules_from_manifest
from elastic_gpu.core.placement import Unschedulable
from elastic_gpu.core.request import PodRequest
from elastic_gpu.core.schedulers import scheduler_refusal
from elastic_gpu.scheduler import wire
from elastic_gpu.scheduler.handle import BindError, ClaimApi, Handle, PodApi
from elastic_gpu.scheduler.http import json_answer, with_outcome
from elastic_gpu.scheduler.metrics import Metrics
from elastic_gpu.scheduler.state import PodInfo, SchedulerState
from elastic_gpu.scheduler.verbs import PodError, RecentPods, parse_info, pod_uid

log = logging.getLogger(__name__)


class _Settled(Exception):
    """The pod's state in the API decided a bind's outcome; `error` is what to answer."""

    def __init__(self, outcome: str, error: BindError | None) -> None:
        super().__init__(outcome)
        self.outcome = outcome
        self.error = error


def with_binding(pod: Mapping[str, Any], node: str, assignment: Assignment) -> dict[str, Any]:
    """The pod as the API holds it after our Binding: bound, with the assignment."""
    meta = dict(pod.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}),
                           ann.ASSIGNMENT: assignment.to_json(), ann.ASSIGNED_NODE: node}
    return {**pod, "metadata": meta, "spec": {**(pod.get("spec") or {}), "nodeName": node}}


def bound_info(known: PodInfo, node: str, assignment: Assignment) -> PodInfo:
    """`known` after our Binding, as `PodInfo.from_manifest(with_binding(...))` reads it, made
    without reading the manifest again (the pod's requests, stop and reservation are as
    they were; the Binding writes only the node and the two annotations)."""
    return replace(known, node_name=node, assignment=assignment, assignment_error=None,
                   assigned_node=node, manifest=with_binding(known.manifest, node, assignment))


class Binder:
    """The bind verb and everything it writes. It reads the pods filter saw (`recent`) when
    the watch has not delivered a pod yet."""

    def __init__(self, handle: Handle, recent: RecentPods, bind_budget_s: float = 4.0) -> None:
        self._handle = handle
        self._recent = recent
        #: kube-scheduler's extender httpTimeout is 5 s by default: a bind that waited longer
        #: than this for its turn is one kube-scheduler has already given up on.
        self.bind_budget_s = bind_budget_s
        #: one bind per pod at a time: pod uid -> lock, and how many wait on it
        self._bind_locks: dict[str, asyncio.Lock] = {}
        self._bind_users: dict[str, int] = {}

    @property
    def state(self) -> SchedulerState:
        return self._handle.state

    @property
    def api(self) -> PodApi | None:
        return self._handle.api

    @property
    def claims_api(self) -> ClaimApi | None:
        return self._handle.claims_api

    @property
    def metrics(self) -> Metrics:
        return self._handle.metrics

    async def bind(self, body: bytes) -> web.Response:
        args = wire.parse_binding(body, self._handle.limits)
        with self._handle.binds.running():
            return await self._bind_locked(args)

    async def _bind_locked(self, args: wire.ExtenderBindingArgs) -> web.Response:
        started = time.monotonic()
        uid = args.PodUID
        # One bind per pod at a time: a retry kube-scheduler sends after timing out must not
        # interleave its writes with the first attempt's.
        lock = self._bind_locks.setdefault(uid, asyncio.Lock())
        self._bind_users[uid] = self._bind_users.get(uid, 0) + 1
        try:
            async with lock:
                await self._bind(args, started)
        except BindError as err:
            return with_outcome(json_answer({"Error": str(err)}), "failed")
        finally:
            self._bind_users[uid] -= 1
            if not self._bind_users[uid]:
                del self._bind_users[uid], self._bind_locks[uid]
        return with_outcome(json_answer({"Error": ""}), "bound")

    async def _bind(self, args: wire.ExtenderBindingArgs, started: float) -> None:
        key = f"{args.PodNamespace}/{args.PodName}"
        where = f"bind {key} to {args.Node}"
        if self.api is None:
            raise BindError(f"{where}: this extender has no API access", definite=True)
        self.state.require_ready()
        waited = time.monotonic() - started
        if waited > self.bind_budget_s:
            raise BindError(f"{where}: waited {waited:.1f} s behind another bind of this pod; "
                            "kube-scheduler has given up on this call", definite=True)
        manifest, known = await self._manifest(args)
        try:
            # From the record (`known.manifest` is `manifest`), not from the filter's
            # (uid, resourceVersion) cache: a filter request naming this pod's uid and version
            # with other contents must not decide the bind. A watched record's request was
            # read once, by the filter of this version or here.
            request = parse_info(known)
        except PodError as err:
            raise BindError(f"{where}: {err}", definite=True) from None
        dra = bool(self.state.dra_nodes((args.Node,)))
        if known.node_name:
            if known.node_name == args.Node and (
                    (known.assignment is not None and known.assignment.node == args.Node)
                    or not request.wants_gpu or (dra and known.assignment is None)):
                return  # an earlier attempt finished it: the same answer again
            raise BindError(f"{where}: the pod is already bound to {known.node_name}",
                            definite=True)
        self._check_placement(manifest, request, args, where, dra)
        try:
            named = pod_claims(manifest)
        except ClaimAnnotationError as err:
            raise BindError(f"{where}: {err}", definite=True) from None
        if dra:
            await self._bind_dra(args, where, request, bool(named), known.resource_version)
            return
        if named:
            await self._bind_claims(args, where, known, request, named)
            return
        try:
            token, assignment = await self._handle.calls(self.state.reserve, request, args.PodUID,
                                                       args.Node)
        except Unschedulable as err:
            self.metrics.bind_failures.labels("reserve").inc()
            self.metrics.bind_conflicts.labels("reserve").inc()
            raise BindError(f"{where}: {err.reason}", definite=True) from None
        await self._finish_bind(args, where, known, token, assignment)

    async def _bind_dra(self, args: wire.ExtenderBindingArgs, where: str, request: PodRequest,
                        names_claims: bool, version: int | None) -> None:
        """Bind a pod to a DRA-mode node: the Binding alone. kube-scheduler's
        DynamicResources PreBind has written the claims' allocation (its special claim for
        `nvidia.com/gpu`) before this verb is called; no card of ours is reserved and no
        assignment written (`core.dra.nodemode`)."""
        refused = dra_fit_failure(request, names_claims=names_claims)
        if refused is not None:
            self.metrics.bind_failures.labels("placement").inc()
            raise BindError(f"{where}: {describe(refused)}", definite=True)
        try:
            await self._bind_with_truth(args, where, None, version)
        except _Settled as settled:
            if settled.error is not None:
                raise settled.error from None

    async def _finish_bind(self, args: wire.ExtenderBindingArgs, where: str, known: PodInfo,
                           token: int, assignment: Assignment) -> None:
        """Create the Binding for a reservation (on the version `known`), and settle it with
        what happened."""
        outcome = "unknown"
        bound: PodInfo | None = None
        try:
            await self._bind_with_truth(args, where, assignment, known.resource_version)
            outcome = "bound"
            bound = bound_info(known, args.Node, assignment)
        except _Settled as settled:
            outcome = settled.outcome
            if settled.error is None:
                return
            raise settled.error from None
        except BindError as err:
            outcome = "failed" if err.definite else "unknown"
            raise
        finally:
            await self._handle.calls(self.state.settle, args.PodUID, token, outcome, bound)

    def _claim_view(self, where: str, namespace: str, named: Mapping[str, str],
                    node: str) -> PodClaims:
        view = self.state.claim_view(namespace, named)
        if view.blocked:
            raise BindError(f"{where}: {describe_blocks(view.blocked)}", definite=True)
        if view.node is not None and view.node != node:
            container, egpu = next(iter(sorted(view.bound.items())))
            raise BindError(f"{where}: " + describe(off_node_failure(
                container, f"{namespace}/{named[container]}", egpu)), definite=True)
        return view

    async def _bind_claims(self, args: wire.ExtenderBindingArgs, where: str, known: PodInfo,
                           request: PodRequest, named: Mapping[str, str]) -> None:
        """Bind a pod whose containers name claims: bound claims' containers get their
        ElasticGPUs' cards; an unbound WaitForFirstConsumer claim is provisioned on this node
        first (`egpu-<claim uid>`, with the cards chosen for its container), serialized per
        claim, so a second pod naming it uses the first one's ElasticGPU."""
        view = self._claim_view(where, args.PodNamespace, named, args.Node)
        if view.first_consumer and self.claims_api is None:
            raise BindError(f"{where}: this extender has no API access to provision claims",
                            definite=True)
        async with self._handle.claim_locks.held(c.uid for c in view.first_consumer.values()):
            # again: a pod bound meanwhile may have provisioned the claim
            view = self._claim_view(where, args.PodNamespace, named, args.Node)
            try:
                token, assignment, made = await self._handle.calls(
                    self.state.reserve_claims, request, args.PodUID, args.Node, view)
            except Unschedulable as err:
                self.metrics.bind_failures.labels("reserve").inc()
                raise BindError(f"{where}: {err.reason}", definite=True) from None
            try:
                for egpu, egpu_token in made:
                    assignment = await self._create_first_consumer(where, args.Node, egpu,
                                                                   egpu_token, assignment)
            except BindError:
                # no Binding was sent: the pod's reservation ends here
                await self._handle.calls(self.state.settle, args.PodUID, token, "failed", None)
                raise
            await self._finish_bind(args, where, known, token, assignment)

    async def _create_first_consumer(self, where: str, node: str, egpu: claims_model.ElasticGPU,
                                     token: int, assignment: Assignment) -> Assignment:
        """Create a first consumer's ElasticGPU; the assignment, with the cards of the
        ElasticGPU that exists (ours, or one an earlier attempt created on this node)."""
        assert self.claims_api is not None
        try:
            created = await self.claims_api.create_elasticgpu(egpu_api.elasticgpu_to_object(egpu))
        except BindError as err:
            if err.code != 409:
                self.metrics.bind_failures.labels("provision").inc()
                await self._handle.calls(self.state.settle_elasticgpu, egpu.name, token,
                                       "failed" if err.definite else "unknown")
                raise BindError(f"{where}: creating ElasticGPU {egpu.name} failed: {err}",
                                definite=err.definite, code=err.code) from None
            # AlreadyExists: an earlier attempt made it; its cards, if on this node, are ours
            await self._handle.calls(self.state.settle_elasticgpu, egpu.name, token, "failed")
            existing = await self._handle.existing_elasticgpu(where, egpu.name)
            if existing.node != node or existing.claim_ref != egpu.claim_ref:
                raise BindError(f"{where}: ElasticGPU {existing.name} already exists on node "
                                f"{existing.node}", definite=True) from None
            egpu = existing
        else:
            try:
                made = egpu_api.elasticgpu_from_object(created)
            except egpu_api.ElasticGPUObjectError as err:  # the API's own answer: a bug
                await self._handle.calls(self.state.settle_elasticgpu, egpu.name, token,
                                       "unknown")
                raise BindError(f"{where}: {err}", definite=False) from None
            await self._handle.calls(self.state.settle_elasticgpu, egpu.name, token, "created",
                                   made, str((created.get("metadata") or {}).get("uid") or ""))
            egpu = made
        containers = dict(assignment.containers)
        for container, name in assignment.claims.items():
            if name == egpu.name:
                containers[container] = egpu.shares
        return Assignment(assignment.node, containers, assignment.claims)

    def _check_placement(self, manifest: Mapping[str, Any], request: PodRequest,
                         args: wire.ExtenderBindingArgs, where: str, dra: bool) -> None:
        """Refuse what kube-scheduler (with this extender's filter) would never have chosen:
        a bind is a write anyone who reaches the port could ask for."""
        if not extender_binds(request, manifest, dra):
            raise BindError(f"{where}: the pod asks for no GPU resource; this extender binds "
                            "only GPU pods (kube-scheduler sends it only pods naming one of "
                            "its managedResources) and, on DRA nodes, pods naming "
                            "ResourceClaims", definite=True)
        node = self.state.node(args.Node)
        if node is None:
            raise BindError(f"{where}: node {args.Node} is unknown to the GPU scheduler",
                            definite=True)
        # kube-scheduler binds only its own profiles' pods (core.schedulers)
        refused = scheduler_refusal(manifest, self.state.config.scheduler_names)
        if refused is not None:
            self.metrics.bind_failures.labels("placement").inc()
            raise BindError(f"{where}: {refused}", definite=True)
        try:
            rules = rules_from_manifest(manifest)
        except RulesError as err:
            raise BindError(f"{where}: the pod's {err}", definite=True) from None
        reason = refusal(rules, node.name, node.labels, node.taints)
        if reason is not None:
            self.metrics.bind_failures.labels("placement").inc()
            raise BindError(f"{where}: {reason}", definite=True)

    async def _bind_with_truth(self, args: wire.ExtenderBindingArgs, where: str,
                               assignment: Assignment | None, version: int | None) -> None:
        """Create the Binding; if that fails, read the pod to learn what really happened.

        Raises `_Settled` when the pod's state decides the outcome (bound, by this attempt
        despite an error or by another), `BindError` when it failed and the pod is unbound.
        """
        for attempt in range(2):
            try:
                await self._create_binding(args, where, assignment, version)
                return
            except BindError as err:
                failure = err
            fresh = await self._fresh(args)
            if fresh is None:
                raise failure  # cannot tell: definite only if the API said so
            info = PodInfo.from_manifest(fresh)
            if info.uid != args.PodUID:
                raise _Settled("failed", BindError(f"{where}: the pod was deleted and "
                                                   "re-created", definite=True))
            if info.node_name:
                self.state.observe_pod(fresh)  # bound: its annotation is the truth
                if info.node_name == args.Node and info.assignment == assignment:
                    raise _Settled("bound", None)  # ours landed despite the error
                raise _Settled("bound", BindError(
                    f"{where}: the pod is already bound to {info.node_name}", definite=True))
            if failure.code == 409 and attempt == 0 and info.resource_version != version:
                version = info.resource_version  # it changed while pending: once more
                continue
            raise failure
        raise AssertionError("unreachable")

    async def _fresh(self, args: wire.ExtenderBindingArgs) -> dict[str, Any] | None:
        assert self.api is not None
        try:
            return await self.api.get_pod(args.PodNamespace, args.PodName)
        except BindError as err:
            log.warning("cannot read pod %s/%s after a failed bind: %s", args.PodNamespace,
                        args.PodName, err)
            return None

    async def _create_binding(self, args: wire.ExtenderBindingArgs, where: str,
                              assignment: Assignment | None, version: int | None) -> None:
        """The Binding carries the assignment annotations: the apiserver sets them and the
        node name in one write, and only on the pod version we decided on (uid and
        resourceVersion preconditions), so a bound pod always has its assignment and one
        pod never gets two."""
        assert self.api is not None
        notes = ({ann.ASSIGNMENT: assignment.to_json(), ann.ASSIGNED_NODE: assignment.node}
                 if assignment is not None else {})
        try:
            await self.api.bind(args.PodNamespace, args.PodName, args.PodUID, args.Node,
                                version, notes)
        except BindError as err:
            self.metrics.bind_failures.labels("binding").inc()
            if err.code == 409:
                self.metrics.bind_conflicts.labels("binding").inc()
            raise BindError(f"{where}: creating the Binding failed: {err}",
                            definite=err.definite, code=err.code) from None

    async def _manifest(self, args: wire.ExtenderBindingArgs
                        ) -> tuple[Mapping[str, Any], PodInfo]:
        """The pod to bind and what the state reads of it: the watched pod as the state holds
        it (read once), else the one filter saw, else the API's."""
        known = self.state.pod(args.PodUID)
        if known is not None:
            return known.manifest, known
        recent = self._recent.get(args.PodUID)
        # Only a pod with a resourceVersion: the Binding then carries it as a precondition,
        # so it lands only on the very version whose spec the placement check read.
        if recent is not None and (recent.get("metadata") or {}).get("resourceVersion"):
            return recent, PodInfo.from_manifest(recent)
        assert self.api is not None
        pod = await self.api.get_pod(args.PodNamespace, args.PodName)
        key = f"{args.PodNamespace}/{args.PodName}"
        if pod is None:
            raise BindError(f"pod {key} does not exist", definite=True)
        if pod_uid(pod) != args.PodUID:
            raise BindError(f"pod {key} has UID {pod_uid(pod)}, not {args.PodUID}: it was "
                            "deleted and re-created", definite=True)
        return pod, PodInfo.from_manifest(pod)
