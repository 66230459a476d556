"""What the extender's parts (`http`, `verbs`, `binder`, `provisioner`) share: its fields, the
API it writes through (`PodApi`, `ClaimApi`, whose failures are `BindError`), and the calls
across parts. `server.Extender` is all the parts over this base.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

from aiohttp import web

from elastic_gpu.api import elasticgpu as egpu_api
from elastic_gpu.core.claims import model as claims_model
from elastic_gpu.core.request import PodRequest
from elastic_gpu.scheduler import wire
from elastic_gpu.scheduler.leadership import Role
from elastic_gpu.scheduler.metrics import Metrics
from elastic_gpu.scheduler.state import SchedulerState

log = logging.getLogger(__name__)

#: Bodies above this size (or of unknown length) are handled in a worker thread.
LARGE_BODY_BYTES = 256 * 1024
#: Candidate nodes above which planning also moves to a worker thread.
LARGE_NODE_COUNT = 2_000
#: Large requests handled at once, and how many more may wait before 429.
HEAVY_SLOTS = 2
HEAVY_QUEUE = 8


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


class ExtenderBase:
    """The fields of `server.Extender` and what its parts share: the calls into the state, the
    per-claim provisioning locks, reading back an ElasticGPU; and, abstract, the verbs the
    HTTP routes serve (defined by the parts named)."""

    def __init__(self, state: SchedulerState, api: PodApi | None = None,
                 metrics: Metrics | None = None, bind_budget_s: float = 4.0,
                 claims_api: ClaimApi | None = None) -> None:
        self.state = state
        self.api = api
        #: whether this replica answers the verbs now (leader election, `leadership`)
        self.role = Role()
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

    async def _state_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call into the state on the event loop, or in a thread while a verb runs in one (the
        state's lock may be held by it for a whole plan; the loop must not wait on it)."""
        if not self._in_threads:
            return fn(*args)
        return await asyncio.to_thread(fn, *args)

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

    async def _existing_elasticgpu(self, where: str, name: str) -> claims_model.ElasticGPU:
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

    # ---- the verbs, as the HTTP routes call them -----------------------------------------

    @abstractmethod
    def filter(self, body: bytes) -> web.Response: ...  # verbs

    @abstractmethod
    def prioritize(self, body: bytes) -> web.Response: ...  # verbs

    @abstractmethod
    def preempt(self, body: bytes) -> web.Response: ...  # verbs

    @abstractmethod
    async def bind(self, body: bytes) -> web.Response: ...  # binder

    @abstractmethod
    async def provision(self, body: bytes) -> web.Response: ...  # provisioner
