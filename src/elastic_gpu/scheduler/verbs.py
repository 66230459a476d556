"""filter, prioritize and preempt: kube-scheduler's questions, answered from the state.

A pod's request is parsed once per (uid, resourceVersion); the pods seen in filter are kept slim
(`recent_pod`) for the bind, which gets only names.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from aiohttp import web

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.claims.pods import ClaimAnnotationError, pod_claims
from elastic_gpu.core.fit import FitFailure, category_counts, describe
from elastic_gpu.core.nodemode import DRA_MODE, NodeMode, Victims
from elastic_gpu.core.placement import FilterResult
from elastic_gpu.core.request import PodRequest, pod_request_from_manifest
from elastic_gpu.core.resources import ResourceError
from elastic_gpu.scheduler import wire
from elastic_gpu.scheduler.config import known_policies
from elastic_gpu.scheduler.handle import Handle
from elastic_gpu.scheduler.http import json_answer, with_outcome
from elastic_gpu.scheduler.metrics import main_reason
from elastic_gpu.scheduler.narrowing import BECAUSE_CONFIGURED, because, wants_every_node
from elastic_gpu.scheduler.state import PodInfo, SchedulerState
from elastic_gpu.scheduler.state.placement import without_containers

log = logging.getLogger(__name__)

#: What the recent-pods cache (pods seen in filter, for the bind) may hold, in bytes of slim
#: pods (about 1 KiB each: thousands of pods between a filter and its bind).
RECENT_BYTES = 8 * 2**20


def recent_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What the bind needs of a pod seen in filter: the validated manifest (`wire.Pod`) with
    only this project's annotations (all others are dropped: they can be 256 KiB)."""
    meta = dict(pod.get("metadata") or {})
    notes = meta.get("annotations")
    if notes:
        meta["annotations"] = {k: v for k, v in notes.items() if f"{ann.PREFIX}/" in k}
    return {**pod, "metadata": meta}


class PodError(ValueError):
    """The pod itself asks for something we cannot interpret."""


def pod_uid(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    if isinstance(uid, str) and uid:
        return uid
    # kube-scheduler always sends a UID; without one, key by name so what-ifs still work.
    name = meta.get("name", "") if isinstance(meta, Mapping) else ""
    namespace = meta.get("namespace", "default") if isinstance(meta, Mapping) else "default"
    return f"{namespace}/{name}"


def parse_pod(pod: Mapping[str, Any]) -> PodRequest:
    try:
        request = pod_request_from_manifest(pod)
    except (ResourceError, ValueError, TypeError, AttributeError) as err:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}" \
            if isinstance(meta, Mapping) else "?"
        raise PodError(f"pod {key}: {err}") from None
    return checked(request)


def parse_info(info: PodInfo) -> PodRequest:
    """`parse_pod` of a record: its request is read once (`PodInfo.request`), however many
    verbs ask."""
    try:
        request = info.request()
    except (ResourceError, ValueError, TypeError, AttributeError) as err:
        raise PodError(f"pod {info.key}: {err}") from None
    return checked(request)


def checked(request: PodRequest) -> PodRequest:
    """The request, if the policies its annotations name exist."""
    for tier, name in (("node", request.node_policy), ("card", request.card_policy)):
        if name is not None and name not in known_policies(tier):
            raise PodError(f"pod {request.key}: annotation elasticgpu.io/{tier}-policy={name!r} "
                           f"is not a {tier} policy; use one of {', '.join(known_policies(tier))}")
    # The pod's CPU and memory stay in the request (as `egpu simulate` and the state's tests
    # build it): kube-scheduler owns their fit (the engine runs with check_host_resources=False)
    # but the node policies score them against what the node has left (FGD's fit test, the CPU
    # tie-breaks), and a bind in flight holds them (`SchedulerState.reserve`). The engine's
    # score cache is per task shape: pods that differ in CPU are scored apart because their
    # scores differ; memory is dropped from the key for policies that do not read it.
    return request


class DevicePluginMode:
    """Device-plugin nodes (`core.nodemode.NodeMode`): the pod's ElasticGPUClaims are checked
    first (the "claims" check: a bound claim ties the pod to its ElasticGPU's node, an unbound
    one rules out every node), then the engine decides fit, scores and chooses victims from
    the state's cards. `narrow`: a filter answers only the engine's choice when a node fits
    (`filterResult`; `auto` decides per pod, `Verbs.filter`)."""

    def __init__(self, state: SchedulerState, narrow: bool | None = None) -> None:
        self._state = state
        self._narrow = narrow

    def fit(self, request: PodRequest, uid: str, nodes: Sequence[str],
            claims: Mapping[str, str]) -> FilterResult:
        if not claims:
            # the verb answers no reasons when a node fits: none asked for then
            return self._state.filter(request, uid, nodes, reasons_if_fit=False,
                                      narrow=self._narrow)
        result, refused = self._state.filter_claims(request, uid, nodes, claims,
                                                    narrow=self._narrow)
        if not refused:
            return result
        # a claim rules the node out whatever it has: its failure is the claim's
        failed = {n: f for n, f in result.failed.items() if n not in refused}
        failed.update(refused)
        return FilterResult(result.feasible, failed)

    def score(self, request: PodRequest, uid: str, nodes: Sequence[str]) -> dict[str, int]:
        return self._state.prioritize(request, uid, nodes)

    def may_preempt(self, request: PodRequest, uid: str, candidates: Mapping[str, Victims],
                    claims: Mapping[str, str]) -> dict[str, Victims]:
        # the verb already kept only the node the bound claims tie the pod to
        return self._state.preempt(request, uid, candidates)


class RecentPods:
    """Pods seen in filter, for the bind, which gets only names (the watch may not have them
    yet): slim (`recent_pod`) and bounded in bytes (`RECENT_BYTES`), oldest out first. Filters
    of large requests run in worker threads, so it has its own lock."""

    def __init__(self, limit_bytes: int = RECENT_BYTES) -> None:
        self._limit = limit_bytes
        self._pods: OrderedDict[str, tuple[dict[str, Any], int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def remember(self, uid: str, pod: Mapping[str, Any]) -> None:
        slim = recent_pod(pod)
        size = len(msgspec.json.encode(slim))
        with self._lock:
            old = self._pods.pop(uid, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self._limit:
                return
            self._pods[uid] = (slim, size)
            self._bytes += size
            while self._bytes > self._limit:
                self._bytes -= self._pods.popitem(last=False)[1][1]

    def get(self, uid: str) -> dict[str, Any] | None:
        """The slim pod seen in filter under `uid`, if still kept."""
        kept = self._pods.get(uid)
        return kept[0] if kept is not None else None

    def size(self, uid: str) -> int | None:
        """Its bytes (JSON), as counted against the bound; None when not kept."""
        kept = self._pods.get(uid)
        return kept[1] if kept is not None else None

    def __contains__(self, uid: object) -> bool:
        return uid in self._pods

    @property
    def bytes(self) -> int:
        """Bytes held (slim pods, JSON size), at most the bound."""
        return self._bytes

    @property
    def sizes(self) -> list[int]:
        return [size for _, size in self._pods.values()]


class Verbs:
    """The verbs that only read the state, the parsed-request cache they share and the
    recent-pods cache they fill (the binder reads it)."""

    def __init__(self, handle: Handle) -> None:
        self._handle = handle
        self.recent = RecentPods()
        # Parsed requests by (uid, resourceVersion): filter and bind read the same pod version,
        # and any change to a pod's spec or annotations gives it a new resourceVersion.
        self._parsed: OrderedDict[tuple[str, str], PodRequest] = OrderedDict()

    @property
    def state(self) -> SchedulerState:
        return self._handle.state

    def _parse(self, pod: Mapping[str, Any]) -> PodRequest:
        meta = pod.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        if not isinstance(version, str) or not version:
            return parse_pod(pod)
        key = (pod_uid(pod), version)
        known = self.state.pod(key[0])
        if known is not None and known.resource_version is not None \
                and str(known.resource_version) == version:
            # the watch's record of this very version: read once, and the bind reuses it
            return parse_info(known)
        request = self._parsed.get(key)
        if request is None:
            request = self._parsed[key] = parse_pod(pod)
            if len(self._parsed) > 10_000:
                self._parsed.popitem(last=False)
        return request

    def _by_mode(self, names: Sequence[str], narrow: bool | None = None
                 ) -> list[tuple[NodeMode, Sequence[str]]]:
        """`names` grouped by their node's mode. The device-plugin mode is asked even of no
        nodes, as before the seam: its filter notes the pod as filtered (`wakeups`)."""
        device_plugin = DevicePluginMode(self.state, narrow)
        dra = self.state.dra_nodes(names)
        if not dra:
            return [(device_plugin, names)]
        return [(device_plugin, [n for n in names if n not in dra]),
                (DRA_MODE, [n for n in names if n in dra])]

    def _narrow(self, pod: Mapping[str, Any], names: Sequence[str]) -> bool:
        """Whether this filter answers only the engine's choice (`filterResult`): `auto` does
        unless kube-scheduler's scores would weigh something the pod asked for
        (`narrowing.wants_every_node`)."""
        mode = self._handle.config.filter_result
        if mode != "auto":
            narrow, why = mode == "best", BECAUSE_CONFIGURED
        else:
            reason = wants_every_node(pod, names, self.state.prefer_no_schedule())
            narrow, why = reason is None, because(reason)
        self._handle.metrics.filter_answers.labels("one" if narrow else "every", why).inc()
        return narrow

    # ---- verbs ------------------------------------------------------------------------------

    def filter(self, body: bytes) -> web.Response:
        args = wire.parse_args(body, self._handle.limits)
        names = args.node_names()
        try:
            request = self._parse(args.Pod)
        except PodError as err:
            return with_outcome(json_answer(wire.filter_error(str(err))), "error")
        uid = pod_uid(args.Pod)
        try:
            named = pod_claims(args.Pod)
        except ClaimAnnotationError as err:
            return with_outcome(json_answer(wire.filter_error(str(err))), "error")
        self.recent.remember(uid, args.Pod)
        if not request.wants_gpu:
            return json_answer(wire.filter_result(args, names, {}, {}))
        feasible: list[str] = []
        refused: dict[str, FitFailure] = {}
        for mode, nodes in self._by_mode(names, self._narrow(args.Pod, names)):
            result = mode.fit(request, uid, nodes, named)
            feasible += result.feasible
            refused.update(result.failed)
        if feasible:
            # kube-scheduler reads the failed nodes' reasons only when no node passes (the
            # FitError's message, preemption's candidates; `schedulePod` drops them
            # otherwise): with a node that fits, they are JSON it would decode for nothing
            return with_outcome(json_answer(wire.filter_result(args, feasible, {}, {})),
                                "feasible")
        known = self.state.known_nodes()
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        # Most failed nodes share one failure object (past the detailed ones, the summary;
        # an unbound claim's; nodes that fail alike): its sentence is made once per request,
        # keyed by the object.
        sentences: dict[int, tuple[str, bool]] = {}
        for node, failure in refused.items():
            # The sentence is made here, once; it never names the node (`core.fit`), so
            # kube-scheduler can count identical reasons ("3 <reason>").
            said = sentences.get(id(failure))
            if said is None:
                said = sentences[id(failure)] = (describe(failure), failure.kind.unresolvable)
            (unresolvable if said[1] or node not in known else failed)[node] = said[0]
        response = json_answer(wire.filter_result(args, feasible, failed, unresolvable))
        reason = main_reason(category_counts(refused.values()))
        self._handle.metrics.unschedulable.labels(reason).inc()
        return with_outcome(response, "unschedulable")

    def _claim_request(self, pod: Mapping[str, Any], request: PodRequest
                       ) -> tuple[PodRequest, str | None, bool, dict[str, str]]:
        """(the request of a pod's containers that are not backed by bound claims, the node
        its bound claims tie it to, whether an unbound claim rules out every node, the claims
        its containers name)."""
        try:
            named = pod_claims(pod)
        except ClaimAnnotationError:
            return request, None, True, {}
        if not named:
            return request, None, False, named
        view = self.state.claim_view(request.namespace, named)
        return (without_containers(request, view.bound), view.node, bool(view.blocked),
                named)

    def prioritize(self, body: bytes) -> web.Response:
        args = wire.parse_args(body, self._handle.limits)
        names = args.node_names()
        try:
            request = self._parse(args.Pod)
        except PodError as err:
            # kube-scheduler ignores prioritize errors; the filter already told the user.
            return json_answer({"Error": str(err)}, status=422)
        request, node, blocked, _ = self._claim_request(args.Pod, request)
        if blocked:
            return json_answer(wire.host_priorities({}))  # every node 0: none listed
        uid = pod_uid(args.Pod)
        scores: dict[str, int] = {}
        for mode, nodes in self._by_mode(names):
            scores.update(mode.score(request, uid, nodes))
        if node is not None:
            scores = {node: scores[node]} if node in scores else {}
        return json_answer(wire.host_priorities(scores))

    def preempt(self, body: bytes) -> web.Response:
        args = wire.parse_preemption(body, self._handle.limits)
        candidates = args.victims()
        try:
            request = self._parse(args.Pod)
        except PodError as err:
            return json_answer({"NodeNameToMetaVictims": None, "Error": str(err)}, status=422)
        if not request.wants_gpu:
            return json_answer(wire.preemption_result(candidates))
        request, node, blocked, named = self._claim_request(args.Pod, request)
        if blocked:
            return json_answer(wire.preemption_result({}))  # no victim makes an unbound claim bound
        if node is not None:
            # only its ElasticGPU's node; its claim containers need nothing freed there
            candidates = {n: v for n, v in candidates.items() if n == node}
            if not request.wants_gpu:
                return json_answer(wire.preemption_result(candidates))
        uid = pod_uid(args.Pod)
        chosen: dict[str, Victims] = {}
        for mode, nodes in self._by_mode(list(candidates)):
            chosen.update(mode.may_preempt(request, uid, {n: candidates[n] for n in nodes},
                                           named))
        return json_answer(wire.preemption_result(chosen))
