"""The extender's HTTP server: filter, prioritize, bind, preempt, health, readiness, metrics.

Every answer is either the verb's result, an `Error` kube-scheduler shows to the user (for
pods we cannot place: a reason a person can act on), or a 4xx for bodies kube-scheduler would
never send. Nothing a client sends can produce a 500.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.engine import Unschedulable
from elastic_gpu.core.request import PodRequest, pod_request_from_manifest
from elastic_gpu.core.resources import ResourceError
from elastic_gpu.scheduler import wire
from elastic_gpu.scheduler.config import known_policies
from elastic_gpu.scheduler.metrics import Metrics
from elastic_gpu.scheduler.state import PodInfo, SchedulerState, StateNotReady

log = logging.getLogger(__name__)

VERBS = ("filter", "prioritize", "bind", "preempt")


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
                 metrics: Metrics | None = None, bind_budget_s: float = 4.0) -> None:
        self.state = state
        self.api = api
        #: kube-scheduler's extender httpTimeout is 5 s by default: a bind that waited longer
        #: than this for its turn is one kube-scheduler has already given up on.
        self.bind_budget_s = bind_budget_s
        self._bind_locks: dict[str, asyncio.Lock] = {}
        self._bind_users: dict[str, int] = {}
        self.metrics = metrics or Metrics(state.card_usage, state.host_usage, state.workload_size,
                                          state.wakeup_stats)
        # Pods seen in filter: bind gets only names, and the watch may not have them yet.
        self._recent: OrderedDict[str, dict[str, Any]] = OrderedDict()
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

    def _remember(self, uid: str, pod: dict[str, Any]) -> None:
        self._recent[uid] = pod
        self._recent.move_to_end(uid)
        while len(self._recent) > 10_000:
            self._recent.popitem(last=False)

    # ---- verbs ------------------------------------------------------------------------------

    def filter(self, body: bytes) -> web.Response:
        args = wire.parse(wire.ExtenderArgs, body)
        names = args.node_names()
        try:
            request = self._parse(args.Pod)
        except PodError as err:
            return _json(wire.filter_error(str(err)))
        uid = pod_uid(args.Pod)
        self._remember(uid, args.Pod)
        if not request.wants_gpu:
            return _json(wire.filter_result(args, names, {}, {}))
        result = self.state.filter(request, uid, names)
        known = self.state.known_nodes()
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        for node, reason in result.failed.items():
            # kube-scheduler counts identical reasons ("3 <reason>"): drop the node's name.
            prefix = f"node {node}: "
            reason = reason.removeprefix(prefix)
            (failed if node in known else unresolvable)[node] = reason
        return _json(wire.filter_result(args, result.feasible, failed, unresolvable))

    def prioritize(self, body: bytes) -> web.Response:
        args = wire.parse(wire.ExtenderArgs, body)
        names = args.node_names()
        try:
            request = self._parse(args.Pod)
        except PodError as err:
            # kube-scheduler ignores prioritize errors; the filter already told the user.
            return _json({"Error": str(err)}, status=422)
        scores = self.state.prioritize(request, pod_uid(args.Pod), names)
        return _json(wire.host_priorities(scores))

    def preempt(self, body: bytes) -> web.Response:
        args = wire.parse(wire.ExtenderPreemptionArgs, body)
        candidates = args.victims()
        try:
            request = self._parse(args.Pod)
        except PodError as err:
            return _json({"NodeNameToMetaVictims": None, "Error": str(err)}, status=422)
        if not request.wants_gpu:
            return _json(wire.preemption_result(candidates))
        chosen = self.state.preempt(request, pod_uid(args.Pod), candidates)
        return _json(wire.preemption_result(chosen))

    async def bind(self, body: bytes) -> web.Response:
        args = wire.parse(wire.ExtenderBindingArgs, body)
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
            return _json({"Error": str(err)})
        finally:
            self._bind_users[uid] -= 1
            if not self._bind_users[uid]:
                del self._bind_users[uid], self._bind_locks[uid]
        return _json({"Error": ""})

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
            request = self._parse(manifest)
        except PodError as err:
            raise BindError(f"{where}: {err}", definite=True) from None
        known = PodInfo.from_manifest(manifest)
        if known.node_name:
            if known.node_name == args.Node and (known.holds is not None
                                                 or not request.wants_gpu):
                return  # an earlier attempt finished it: the same answer again
            raise BindError(f"{where}: the pod is already bound to {known.node_name}",
                            definite=True)
        if not request.wants_gpu:
            await self._create_binding(args, where, None, known.resource_version)
            return
        try:
            token, assignment = self.state.reserve(request, args.PodUID, args.Node)
        except Unschedulable as err:
            self.metrics.bind_failures.labels("reserve").inc()
            raise BindError(f"{where}: {err.reason}", definite=True) from None
        outcome = "unknown"
        bound: dict[str, Any] | None = None
        try:
            await self._bind_with_truth(args, where, assignment, known.resource_version)
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
            self.state.settle(args.PodUID, token, outcome, bound)

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
            raise BindError(f"{where}: creating the Binding failed: {err}",
                            definite=err.definite, code=err.code) from None

    async def _manifest(self, args: wire.ExtenderBindingArgs) -> dict[str, Any]:
        known = self.state.pod(args.PodUID)
        if known is not None:
            return dict(known.manifest)
        recent = self._recent.get(args.PodUID)
        if recent is not None:
            return recent
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
                body = await request.read()
                result = handler(body)
                response = await result if isinstance(result, Awaitable) else result
            except wire.WireError as err:
                self.metrics.bad_requests.labels(verb).inc()
                response = _json({"Error": str(err)}, status=400)
            except StateNotReady as err:
                response = _json({"Error": str(err)}, status=503)
            finally:
                self.metrics.latency.labels(verb).observe(time.perf_counter() - started)
            return response
        return handle

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
        app = web.Application(client_max_size=64 * 1024 * 1024)
        handlers: dict[str, Callable[[bytes], Awaitable[web.Response] | web.Response]] = {
            "filter": self.filter, "prioritize": self.prioritize, "bind": self.bind,
                    "preempt": self.preempt}
        for verb, handler in handlers.items():
            app.router.add_post(f"{prefix}/{verb}", self._timed(verb, handler))
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics_page)
        return app
