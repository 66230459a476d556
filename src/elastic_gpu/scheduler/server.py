"""The extender's HTTP server: filter, prioritize, bind, preempt, health, readiness, metrics.

Every answer is either the verb's result, an `Error` kube-scheduler shows to the user (for
pods we cannot place: a reason a person can act on), or a 4xx for bodies kube-scheduler would
never send: every body is validated once, completely, by `wire` (bounded types), so nothing
past it meets an unexpected type. A last-resort handler still logs any exception and answers
500, so a bug never kills the server, but no input is meant to reach it.

Cost of one request is bounded (docs/scheduler.md, "HTTP limits"): a body over
`maxRequestBytes` gets 413 before it is read; bodies over `LARGE_BODY_BYTES` (or of unknown
length) are read, decoded, planned and encoded in a worker thread, at most `HEAVY_SLOTS` at a
time with `HEAVY_QUEUE` more waiting (then 429), so health checks, small filters and binds keep
flowing on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from elastic_gpu.api import elasticgpu as egpu_api
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.claims import decisions as claim_decisions
from elastic_gpu.core.claims import model as claim_model
from elastic_gpu.core.claims.decisions import InSync
from elastic_gpu.core.claims.model import provisioned_name
from elastic_gpu.core.claims.pods import ClaimAnnotationError, PodClaims, off_node_reason, pod_claims
from elastic_gpu.core.fit import FitKind, describe
from elastic_gpu.core.nodeaffinity import RulesError, refusal, rules_from_manifest
from elastic_gpu.core.placement import Unschedulable
from elastic_gpu.core.request import PodRequest, pod_request_from_manifest
from elastic_gpu.core.resources import ResourceError
from elastic_gpu.core.schedulers import scheduler_refusal
from elastic_gpu.scheduler import wire
from elastic_gpu.scheduler.config import known_policies
from elastic_gpu.scheduler.metrics import Metrics, main_reason
from elastic_gpu.scheduler.state import (
    PodInfo,
    SchedulerState,
    StateNotReady,
    without_containers,
)

log = logging.getLogger(__name__)

VERBS = ("filter", "prioritize", "bind", "preempt", "provision")

#: Bodies above this size (or of unknown length) are handled in a worker thread.
LARGE_BODY_BYTES = 256 * 1024
#: Candidate nodes above which planning also moves to a worker thread.
LARGE_NODE_COUNT = 2_000
#: Large requests handled at once, and how many more may wait before 429.
HEAVY_SLOTS = 2
HEAVY_QUEUE = 8
#: What the recent-pods cache (pods seen in filter, for the bind) may hold, in bytes of slim
#: pods (about 1 KiB each: thousands of pods between a filter and its bind).
RECENT_BYTES = 8 * 2**20
#: A bind's body is four names.
BIND_BODY_BYTES = 64 * 1024


class BodyTooLarge(Exception):
    """More bytes than the limit; the message says how many and which limit."""


class _Busy(Exception):
    """Too many large requests at once (429)."""


def _too_large(size: int, limit: int, verb: str) -> str:
    which = "a bind's body is four names" if verb == "bind" else \
        "a provision's body is three names" if verb == "provision" else \
        "maxRequestBytes; nodeCacheCapable: true sends names, not Node objects"
    return f"request body of {size} bytes is over the limit of {limit} bytes ({which})"


async def _read(request: web.Request, limit: int, verb: str) -> bytes:
    """The body, refused (BodyTooLarge) as soon as more than `limit` bytes arrived."""
    chunks = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(_too_large(size, limit, verb) + " (the rest was not read)")
        chunks.append(chunk)
    return b"".join(chunks)


def recent_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What the bind needs of a pod seen in filter: the validated manifest (`wire.Pod`) with
    only this project's annotations (all others are dropped: they can be 256 KiB)."""
    meta = dict(pod.get("metadata") or {})
    notes = meta.get("annotations")
    if notes:
        meta["annotations"] = {k: v for k, v in notes.items() if f"{ann.PREFIX}/" in k}
    return {**pod, "metadata": meta}


class BindError(RuntimeError):
    """An API write of the bind failed. `definite`: the API said no (nothing was written);
    otherwise the outcome is unknown (timeout, lost connection)."""

    def __init__(self, message: str, *, definite: bool, code: int = 0) -> None:
        super().__init__(message)
        self.definite = definite
        self.code = code


class PodApi(Protocol):
    """The API calls a bind needs (implemented by the API worker, `scheduler.worker_link`)."""

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   resource_version: int | None, annotations: Mapping[str, str]) -> None: ...


class ClaimApi(Protocol):
    """The Elastic GPU API calls of /provision and of binding pods that name claims
    (implemented by the API worker, `scheduler.worker_link`). Objects come back slim."""

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def get_elasticgpu(self, name: str) -> dict[str, Any] | None: ...

    async def create_elasticgpu(self, obj: Mapping[str, Any]) -> dict[str, Any]: ...


class _NotFound(Exception):
    """/provision: the claim does not exist (404)."""


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


class PodError(ValueError):
    """The pod itself asks for something we cannot interpret."""


#: The outcome of an answer by its status, when the verb did not name one.
_STATUS_OUTCOMES = {400: "bad_request", 413: "bad_request", 429: "busy", 503: "not_ready",
                    500: "internal_error"}
_OUTCOME = web.ResponseKey("outcome", str)


def _outcome(response: web.Response, outcome: str) -> web.Response:
    """Tag an answer with its outcome (`elasticgpu_scheduler_requests_total{outcome}`)."""
    response[_OUTCOME] = outcome
    return response


def response_outcome(response: web.Response) -> str:
    """The outcome an answer was tagged with; else by its status: 2xx ok, 4xx/5xx by code."""
    tagged: str | None = response.get(_OUTCOME)
    if tagged is not None:
        return tagged
    if response.status < 400:
        return "ok"
    return _STATUS_OUTCOMES.get(response.status, "error")


def _json(data: Any, status: int = 200) -> web.Response:
    # msgspec: a 5,000-node answer encodes in well under a millisecond (stdlib json: ~5 ms)
    return web.Response(body=msgspec.json.encode(data), status=status,
                        content_type="application/json")


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


class Extender:
    def __init__(self, state: SchedulerState, api: PodApi | None = None,
                 metrics: Metrics | None = None, bind_budget_s: float = 4.0,
                 claims_api: ClaimApi | None = None) -> None:
        self.state = state
        self.api = api
        self.claims_api = claims_api
        #: provisioning of one claim (by /provision or a first consumer's bind) is serialized:
        #: claim uid -> lock, and how many wait on it
        self._claim_locks: dict[str, asyncio.Lock] = {}
        self._claim_users: dict[str, int] = {}
        #: kube-scheduler's extender httpTimeout is 5 s by default: a bind that waited longer
        #: than this for its turn is one kube-scheduler has already given up on.
        self.bind_budget_s = bind_budget_s
        self._bind_locks: dict[str, asyncio.Lock] = {}
        self._bind_users: dict[str, int] = {}
        self.metrics = metrics or Metrics(state.card_usage, state.host_usage, state.workload_size,
                                          state.wakeup_stats, state.egpu_holds, state.cards,
                                          state.pod_shares, state.distrusted)
        self.limits = wire.Limits(max_body_bytes=state.config.max_request_bytes,
                                  max_nodes=state.config.max_nodes_per_request)
        # Pods seen in filter: bind gets only names, and the watch may not have them yet.
        # Slim (`recent_pod`) and bounded in bytes (`RECENT_BYTES`), oldest out first.
        self._recent: OrderedDict[str, tuple[dict[str, Any], int]] = OrderedDict()
        self._recent_bytes = 0
        self._recent_lock = threading.Lock()
        self._heavy = asyncio.Semaphore(HEAVY_SLOTS)
        self._heavy_waiting = 0
        #: verbs running in worker threads; while any runs, state calls leave the event loop
        #: too (the thread may hold the state's lock for a whole plan)
        self._in_threads = 0
        #: binds in progress, for a clean drain on SIGTERM (`drained`)
        self._binds = 0
        self._binds_idle = asyncio.Event()
        self._binds_idle.set()
        # Parsed requests by (uid, resourceVersion): filter and bind read the same pod version,
        # and any change to a pod's spec or annotations gives it a new resourceVersion.
        self._parsed: OrderedDict[tuple[str, str], PodRequest] = OrderedDict()

    def _parse(self, pod: Mapping[str, Any]) -> PodRequest:
        meta = pod.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        if not isinstance(version, str) or not version:
            return parse_pod(pod)
        key = (pod_uid(pod), version)
        request = self._parsed.get(key)
        if request is None:
            request = self._parsed[key] = parse_pod(pod)
            if len(self._parsed) > 10_000:
                self._parsed.popitem(last=False)
        return request

    def _remember(self, uid: str, pod: Mapping[str, Any]) -> None:
        slim = recent_pod(pod)
        size = len(msgspec.json.encode(slim))
        with self._recent_lock:  # filters of large requests run in worker threads
            self._remember_locked(uid, slim, size)

    def _remember_locked(self, uid: str, slim: dict[str, Any], size: int) -> None:
        old = self._recent.pop(uid, None)
        if old is not None:
            self._recent_bytes -= old[1]
        if size > RECENT_BYTES:
            return
        self._recent[uid] = (slim, size)
        self._recent_bytes += size
        while self._recent_bytes > RECENT_BYTES:
            self._recent_bytes -= self._recent.popitem(last=False)[1][1]

    @property
    def recent_bytes(self) -> int:
        """Bytes the recent-pods cache holds (slim pods, JSON size), at most RECENT_BYTES."""
        return self._recent_bytes

    # ---- verbs ------------------------------------------------------------------------------

    def filter(self, body: bytes) -> web.Response:
        args = wire.parse_args(body, self.limits)
        names = args.node_names()
        try:
            request = self._parse(args.Pod)
        except PodError as err:
            return _outcome(_json(wire.filter_error(str(err))), "error")
        uid = pod_uid(args.Pod)
        try:
            named = pod_claims(args.Pod)
        except ClaimAnnotationError as err:
            return _outcome(_json(wire.filter_error(str(err))), "error")
        self._remember(uid, args.Pod)
        if not request.wants_gpu:
            return _json(wire.filter_result(args, names, {}, {}))
        claim_reasons: dict[str, str] = {}
        if named:
            result, claim_reasons = self.state.filter_claims(request, uid, names, named)
        else:
            result = self.state.filter(request, uid, names)
        known = self.state.known_nodes()
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        for node, failure in result.failed.items():
            # The sentence is made here, once; it never names the node, so kube-scheduler can
            # count identical reasons ("3 <reason>").
            unknown = failure.kind is FitKind.UNKNOWN_NODE or node not in known
            (unresolvable if unknown else failed)[node] = describe(failure)
        for node, reason in claim_reasons.items():
            # a claim rules the node out whatever it has: kube-scheduler's preemption cannot
            # help either, so these are unresolvable
            failed.pop(node, None)
            unresolvable[node] = reason
        response = _json(wire.filter_result(args, result.feasible, failed, unresolvable))
        if result.feasible:
            return _outcome(response, "feasible")
        reason = main_reason([*(f.category for f in result.failed.values()),
                              *(["claim"] * len(claim_reasons))])
        self.metrics.unschedulable.labels(reason).inc()
        return _outcome(response, "unschedulable")

    def _claim_request(self, pod: Mapping[str, Any], request: PodRequest
                       ) -> tuple[PodRequest, str | None, bool]:
        """(the request of a pod's containers that are not backed by bound claims, the node
        its bound claims tie it to, whether an unbound claim rules out every node)."""
        try:
            named = pod_claims(pod)
        except ClaimAnnotationError:
            return request, None, True
        if not named:
            return request, None, False
        view = self.state.claim_view(request.namespace, named)
        return without_containers(request, view.bound), view.node, view.blocked is not None

    def prioritize(self, body: bytes) -> web.Response:
        args = wire.parse_args(body, self.limits)
        names = args.node_names()
        try:
            request = self._parse(args.Pod)
        except PodError as err:
            # kube-scheduler ignores prioritize errors; the filter already told the user.
            return _json({"Error": str(err)}, status=422)
        request, node, blocked = self._claim_request(args.Pod, request)
        if blocked:
            return _json(wire.host_priorities(dict.fromkeys(names, 0)))
        scores = self.state.prioritize(request, pod_uid(args.Pod), names)
        if node is not None:
            scores = {n: (score if n == node else 0) for n, score in scores.items()}
        return _json(wire.host_priorities(scores))

    def preempt(self, body: bytes) -> web.Response:
        args = wire.parse_preemption(body, self.limits)
        candidates = args.victims()
        try:
            request = self._parse(args.Pod)
        except PodError as err:
            return _json({"NodeNameToMetaVictims": None, "Error": str(err)}, status=422)
        if not request.wants_gpu:
            return _json(wire.preemption_result(candidates))
        request, node, blocked = self._claim_request(args.Pod, request)
        if blocked:
            return _json(wire.preemption_result({}))  # no victim makes an unbound claim bound
        if node is not None:
            # only its ElasticGPU's node; its claim containers need nothing freed there
            candidates = {n: v for n, v in candidates.items() if n == node}
            if not request.wants_gpu:
                return _json(wire.preemption_result(candidates))
        chosen = self.state.preempt(request, pod_uid(args.Pod), candidates)
        return _json(wire.preemption_result(chosen))

    async def bind(self, body: bytes) -> web.Response:
        args = wire.parse_binding(body, self.limits)
        with self._bind_running():
            return await self._bind_locked(args)

    @contextmanager
    def _bind_running(self) -> Iterator[None]:
        self._binds += 1
        self._binds_idle.clear()
        try:
            yield
        finally:
            self._binds -= 1
            if not self._binds:
                self._binds_idle.set()

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no bind is in progress (at most `timeout_s`); False if some still are."""
        try:
            await asyncio.wait_for(self._binds_idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

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
            return _outcome(_json({"Error": str(err)}), "failed")
        finally:
            self._bind_users[uid] -= 1
            if not self._bind_users[uid]:
                del self._bind_users[uid], self._bind_locks[uid]
        return _outcome(_json({"Error": ""}), "bound")

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
        manifest = await self._manifest(args)
        try:
            # Parsed afresh, not from the (uid, resourceVersion) cache: a filter request
            # naming this pod's uid and version with other contents must not decide the bind.
            request = parse_pod(manifest)
        except PodError as err:
            raise BindError(f"{where}: {err}", definite=True) from None
        known = PodInfo.from_manifest(manifest)
        if known.node_name:
            if known.node_name == args.Node and (
                    (known.assignment is not None and known.assignment.node == args.Node)
                    or not request.wants_gpu):
                return  # an earlier attempt finished it: the same answer again
            raise BindError(f"{where}: the pod is already bound to {known.node_name}",
                            definite=True)
        self._check_placement(manifest, request, args, where)
        try:
            named = pod_claims(manifest)
        except ClaimAnnotationError as err:
            raise BindError(f"{where}: {err}", definite=True) from None
        if named:
            await self._bind_claims(args, where, manifest, request, known.resource_version,
                                    named)
            return
        try:
            token, assignment = await self._state_call(self.state.reserve, request, args.PodUID,
                                                       args.Node)
        except Unschedulable as err:
            self.metrics.bind_failures.labels("reserve").inc()
            self.metrics.bind_conflicts.labels("reserve").inc()
            raise BindError(f"{where}: {err.reason}", definite=True) from None
        await self._finish_bind(args, where, manifest, token, assignment,
                                known.resource_version)

    async def _finish_bind(self, args: wire.ExtenderBindingArgs, where: str,
                           manifest: Mapping[str, Any], token: int, assignment: Assignment,
                           version: int | None) -> None:
        """Create the Binding for a reservation, and settle it with what happened."""
        outcome = "unknown"
        bound: dict[str, Any] | None = None
        try:
            await self._bind_with_truth(args, where, assignment, version)
            outcome = "bound"
            bound = with_binding(manifest, args.Node, assignment)
        except _Settled as settled:
            outcome = settled.outcome
            if settled.error is None:
                return
            raise settled.error from None
        except BindError as err:
            outcome = "failed" if err.definite else "unknown"
            raise
        finally:
            await self._state_call(self.state.settle, args.PodUID, token, outcome, bound)

    # ---- claims: pods that name them, and /provision ------------------------------------------

    @contextlib.asynccontextmanager
    async def _claims_locked(self, uids: Iterable[str]) -> AsyncIterator[None]:
        """Hold the provisioning locks of these claims (sorted: no two holders deadlock)."""
        keys = sorted(set(uids))
        async with contextlib.AsyncExitStack() as stack:
            for key in keys:
                lock = self._claim_locks.setdefault(key, asyncio.Lock())
                self._claim_users[key] = self._claim_users.get(key, 0) + 1
                stack.callback(self._claim_unused, key)
                await stack.enter_async_context(lock)
            yield

    def _claim_unused(self, key: str) -> None:
        self._claim_users[key] -= 1
        if not self._claim_users[key]:
            del self._claim_users[key], self._claim_locks[key]

    def _claim_view(self, where: str, namespace: str, named: Mapping[str, str],
                    node: str) -> PodClaims:
        view = self.state.claim_view(namespace, named)
        if view.blocked is not None:
            raise BindError(f"{where}: {view.blocked}", definite=True)
        if view.node is not None and view.node != node:
            container, egpu = next(iter(sorted(view.bound.items())))
            raise BindError(f"{where}: " + off_node_reason(
                container, f"{namespace}/{named[container]}", egpu), definite=True)
        return view

    async def _bind_claims(self, args: wire.ExtenderBindingArgs, where: str,
                           manifest: Mapping[str, Any], request: PodRequest,
                           version: int | None, named: Mapping[str, str]) -> None:
        """Bind a pod whose containers name claims: bound claims' containers get their
        ElasticGPUs' cards; an unbound WaitForFirstConsumer claim is provisioned on this node
        first (`egpu-<claim uid>`, with the cards chosen for its container), serialized per
        claim, so a second pod naming it uses the first one's ElasticGPU."""
        view = self._claim_view(where, args.PodNamespace, named, args.Node)
        if view.first_consumer and self.claims_api is None:
            raise BindError(f"{where}: this extender has no API access to provision claims",
                            definite=True)
        async with self._claims_locked(c.uid for c in view.first_consumer.values()):
            # again: a pod bound meanwhile may have provisioned the claim
            view = self._claim_view(where, args.PodNamespace, named, args.Node)
            try:
                token, assignment, made = await self._state_call(
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
                await self._state_call(self.state.settle, args.PodUID, token, "failed", None)
                raise
            await self._finish_bind(args, where, manifest, token, assignment, version)

    async def _create_first_consumer(self, where: str, node: str, egpu: claim_model.ElasticGPU,
                                     token: int, assignment: Assignment) -> Assignment:
        """Create a first consumer's ElasticGPU; the assignment, with the cards of the
        ElasticGPU that exists (ours, or one an earlier attempt created on this node)."""
        assert self.claims_api is not None
        try:
            created = await self.claims_api.create_elasticgpu(egpu_api.elasticgpu_to_object(egpu))
        except BindError as err:
            if err.code != 409:
                self.metrics.bind_failures.labels("provision").inc()
                await self._state_call(self.state.settle_elasticgpu, egpu.name, token,
                                       "failed" if err.definite else "unknown")
                raise BindError(f"{where}: creating ElasticGPU {egpu.name} failed: {err}",
                                definite=err.definite, code=err.code) from None
            # AlreadyExists: an earlier attempt made it; its cards, if on this node, are ours
            await self._state_call(self.state.settle_elasticgpu, egpu.name, token, "failed")
            existing = await self._existing_elasticgpu(where, egpu.name)
            if existing.node != node or existing.claim_ref != egpu.claim_ref:
                raise BindError(f"{where}: ElasticGPU {existing.name} already exists on node "
                                f"{existing.node}", definite=True) from None
            egpu = existing
        else:
            try:
                made = egpu_api.elasticgpu_from_object(created)
            except egpu_api.ElasticGPUObjectError as err:  # the API's own answer: a bug
                await self._state_call(self.state.settle_elasticgpu, egpu.name, token,
                                       "unknown")
                raise BindError(f"{where}: {err}", definite=False) from None
            await self._state_call(self.state.settle_elasticgpu, egpu.name, token, "created",
                                   made, str((created.get("metadata") or {}).get("uid") or ""))
            egpu = made
        containers = dict(assignment.containers)
        for container, name in assignment.claims.items():
            if name == egpu.name:
                containers[container] = egpu.shares
        return Assignment(assignment.node, containers, assignment.claims)

    async def _existing_elasticgpu(self, where: str, name: str) -> claim_model.ElasticGPU:
        assert self.claims_api is not None
        raw = await self.claims_api.get_elasticgpu(name)
        if raw is None:
            raise BindError(f"{where}: ElasticGPU {name} exists and then does not; retry",
                            definite=False)
        try:
            egpu = egpu_api.elasticgpu_from_object(raw)
        except egpu_api.ElasticGPUObjectError as err:
            raise BindError(f"{where}: {err}", definite=False) from None
        await self._state_call(self.state.upsert_elasticgpu, egpu,
                               str((raw.get("metadata") or {}).get("uid") or ""))
        return egpu

    async def provision(self, body: bytes) -> web.Response:
        """`POST /provision` (docs/claims.md, "The extender's part"): provision a claim from the
        caches; 200 with Provisioned / Pending / NotNeeded, 404 for an unknown claim."""
        args = wire.parse_provision(body)
        if self.claims_api is None:
            return _json({"Error": "this extender has no API access"}, status=503)
        self.state.require_ready()
        key = f"{args.namespace}/{args.name}"
        try:
            with self._bind_running():  # a drain lets it finish, like a bind
                async with self._claims_locked([args.uid]):
                    answer = await self._provision(args, key)
        except _NotFound as err:
            return _json({"Error": str(err)}, status=404)
        except BindError as err:
            # the API refused or did not answer the creation: the controller retries
            return _json({"Error": f"provisioning claim {key}: {err}"}, status=503)
        return _json(answer)

    async def _provision(self, args: wire.ProvisionArgs, key: str) -> dict[str, Any]:
        assert self.claims_api is not None
        claim = self.state.claim(args.namespace, args.name)
        if claim is None or claim.uid != args.uid:
            raw = await self.claims_api.get_claim(args.namespace, args.name)
            try:
                claim = egpu_api.claim_from_object(raw) if raw is not None else None
            except egpu_api.ElasticGPUObjectError as err:
                raise _NotFound(f"ElasticGPUClaim {key} cannot be read: {err}") from None
            if claim is None:
                raise _NotFound(f"ElasticGPUClaim {key} does not exist")
            if claim.uid != args.uid:
                raise _NotFound(f"ElasticGPUClaim {key} has uid {claim.uid}, not {args.uid}: "
                                "it was deleted (and maybe re-created)")
            await self._state_call(self.state.upsert_claim, claim)
        outcome, token = await self._state_call(self.state.provision, claim)
        if isinstance(outcome, claim_model.ElasticGPU):
            assert token is not None
            egpu = await self._create_provisioned(outcome, token, key)
            self.metrics.provisioned.inc()
            return {"result": "Provisioned", "elasticGPU": egpu.name, "node": egpu.node}
        if isinstance(outcome, claim_decisions.Pending):
            return {"result": "Pending", "reason": outcome.reason.value,
                    "message": outcome.message}
        if isinstance(outcome, claim_decisions.Bind) and claim.elastic_gpu_name is None and \
                outcome.elastic_gpu == provisioned_name(claim):
            made = self.state.elasticgpu(outcome.elastic_gpu)  # pre-bound: provisioned already
            return {"result": "Provisioned", "elasticGPU": outcome.elastic_gpu,
                    "node": made.node if made is not None else ""}
        if isinstance(outcome, claim_decisions.Lost):
            return {"result": "NotNeeded", "decision": "Lost",
                    "elasticGPU": claim.elastic_gpu_name or "", "message": outcome.message}
        if isinstance(outcome, InSync | claim_decisions.Bind):
            return {"result": "NotNeeded", "decision": type(outcome).__name__,
                    "elasticGPU": outcome.elastic_gpu}
        raise AssertionError(f"unexpected decision {outcome!r}")  # Provision is never returned

    async def _create_provisioned(self, egpu: claim_model.ElasticGPU, token: int,
                                  key: str) -> claim_model.ElasticGPU:
        assert self.claims_api is not None
        where = f"provision claim {key}"
        try:
            created = await self.claims_api.create_elasticgpu(egpu_api.elasticgpu_to_object(egpu))
        except BindError as err:
            if err.code != 409:
                await self._state_call(self.state.settle_elasticgpu, egpu.name, token,
                                       "failed" if err.definite else "unknown")
                raise BindError(f"creating ElasticGPU {egpu.name}: {err}",
                                definite=err.definite) from None
            await self._state_call(self.state.settle_elasticgpu, egpu.name, token, "failed")
            existing = await self._existing_elasticgpu(where, egpu.name)
            if existing.claim_ref != egpu.claim_ref:
                raise BindError(f"ElasticGPU {egpu.name} exists and is not this claim's",
                                definite=True) from None
            return existing
        try:
            made = egpu_api.elasticgpu_from_object(created)
        except egpu_api.ElasticGPUObjectError as err:
            await self._state_call(self.state.settle_elasticgpu, egpu.name, token, "unknown")
            raise BindError(f"{where}: {err}", definite=False) from None
        await self._state_call(self.state.settle_elasticgpu, egpu.name, token, "created", made,
                               str((created.get("metadata") or {}).get("uid") or ""))
        return made

    def _check_placement(self, manifest: Mapping[str, Any], request: PodRequest,
                         args: wire.ExtenderBindingArgs, where: str) -> None:
        """Refuse what kube-scheduler (with this extender's filter) would never have chosen:
        a bind is a write anyone who reaches the port could ask for."""
        if not request.wants_gpu:
            raise BindError(f"{where}: the pod asks for no GPU resource; this extender binds "
                            "only GPU pods (kube-scheduler sends it only pods naming one of "
                            "its managedResources)", definite=True)
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

    async def _state_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call into the state on the event loop, or in a thread while a verb runs in one (the
        state's lock may be held by it for a whole plan; the loop must not wait on it)."""
        if not self._in_threads:
            return fn(*args)
        return await asyncio.to_thread(fn, *args)

    async def _bind_with_truth(self, args: wire.ExtenderBindingArgs, where: str,
                               assignment: Assignment, version: int | None) -> None:
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

    async def _manifest(self, args: wire.ExtenderBindingArgs) -> dict[str, Any]:
        known = self.state.pod(args.PodUID)
        if known is not None:
            return dict(known.manifest)
        recent = self._recent.get(args.PodUID)
        # Only a pod with a resourceVersion: the Binding then carries it as a precondition,
        # so it lands only on the very version whose spec the placement check read.
        if recent is not None and (recent[0].get("metadata") or {}).get("resourceVersion"):
            return dict(recent[0])
        assert self.api is not None
        pod = await self.api.get_pod(args.PodNamespace, args.PodName)
        key = f"{args.PodNamespace}/{args.PodName}"
        if pod is None:
            raise BindError(f"pod {key} does not exist", definite=True)
        if pod_uid(pod) != args.PodUID:
            raise BindError(f"pod {key} has UID {pod_uid(pod)}, not {args.PodUID}: it was "
                            "deleted and re-created", definite=True)
        return pod

    # ---- HTTP plumbing ----------------------------------------------------------------------

    def _timed(self, verb: str, handler: Callable[[bytes], Awaitable[web.Response] | web.Response]
               ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            started = time.perf_counter()
            try:
                response = await self._serve(verb, request, handler)
            except wire.WireError as err:
                self.metrics.bad_requests.labels(verb).inc()
                response = _json({"Error": str(err)}, status=400)
            except BodyTooLarge as err:
                self.metrics.bad_requests.labels(verb).inc()
                response = _json({"Error": str(err)}, status=413)
            except _Busy as err:
                response = _json({"Error": str(err)}, status=429)
                response.headers["Retry-After"] = "1"
            except StateNotReady as err:
                response = _json({"Error": str(err)}, status=503)
            except Exception as err:  # last resort: a bug must not kill the server
                log.exception("%s: unexpected error", verb)
                response = _json({"Error": f"internal error in the extender ({type(err).__name__}"
                                           "; see its log)"}, status=500)
            finally:
                self.metrics.latency.labels(verb).observe(time.perf_counter() - started)
            self.metrics.requests.labels(verb, response_outcome(response)).inc()
            return response
        return handle

    async def _serve(self, verb: str, request: web.Request,
                     handler: Callable[[bytes], Awaitable[web.Response] | web.Response]
                     ) -> web.Response:
        small = verb in ("bind", "provision")
        limit = BIND_BODY_BYTES if small else self.limits.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:  # refused before a byte of it is read
            raise BodyTooLarge(_too_large(length, limit, verb))
        if small or (length is not None and length <= LARGE_BODY_BYTES):
            body = await _read(request, limit, verb)
            # A small body may still name many nodes (planning them is the cost), and while a
            # verb runs in a thread it may hold the state's lock: then leave the loop too.
            many_names = body.count(b'"') > 2 * LARGE_NODE_COUNT
            if not small and (self._in_threads or many_names):
                return await self._in_thread(handler, body)
            result = handler(body)
            return await result if isinstance(result, Awaitable) else result
        # Large (or of unknown length): a few at a time, the rest wait or are turned away.
        if self._heavy_waiting >= HEAVY_SLOTS + HEAVY_QUEUE:
            raise _Busy(f"{self._heavy_waiting} large requests are in progress or waiting; "
                        "retry shortly")
        self._heavy_waiting += 1
        try:
            async with self._heavy:
                body = await _read(request, limit, verb)
                return await self._in_thread(handler, body)
        finally:
            self._heavy_waiting -= 1

    async def _in_thread(self, handler: Callable[[bytes], Awaitable[web.Response] | web.Response],
                         body: bytes) -> web.Response:
        self._in_threads += 1
        try:
            result = await asyncio.to_thread(handler, body)
        finally:
            self._in_threads -= 1
        assert isinstance(result, web.Response)  # only the synchronous verbs come here
        return result

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(self, request: web.Request) -> web.Response:
        if self.state.ready:
            return web.Response(text="ok")
        return web.Response(text=self.state.not_ready_reason(), status=503)

    async def metrics_page(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def app(self, prefix: str = "") -> web.Application:
        app = web.Application(client_max_size=self.limits.max_body_bytes)
        handlers: dict[str, Callable[[bytes], Awaitable[web.Response] | web.Response]] = {
            "filter": self.filter, "prioritize": self.prioritize, "bind": self.bind,
            "preempt": self.preempt, "provision": self.provision}
        for verb, handler in handlers.items():
            app.router.add_post(f"{prefix}/{verb}", self._timed(verb, handler))
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics_page)
        return app
