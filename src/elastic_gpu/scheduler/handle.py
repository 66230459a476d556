"""What the extender's parts (`verbs`, `binder`, `provisioner`, `http`) share, joined by one
`Handle`: the state, the API it writes through (`PodApi`, `ClaimApi`, whose failures are
`BindError`), the config, the metrics and this replica's role; and the three small objects
more than one part uses (`StateCalls`, `ClaimLocks`, `BindsInFlight`), each with its own
fields. kube-scheduler joins its cache, queue and plugins the same way (`framework.Handle`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from elastic_gpu.api import elasticgpu as egpu_api
from elastic_gpu.core.claims import model as claims_model
from elastic_gpu.scheduler import wire
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.leadership import Role
from elastic_gpu.scheduler.metrics import Metrics
from elastic_gpu.scheduler.state import SchedulerState

#: Bodies above this size (or of unknown length) are handled in a worker thread.
LARGE_BODY_BYTES = 256 * 1024
#: Candidate nodes above which planning also moves to a worker thread.
LARGE_NODE_COUNT = 2_000
#: Large requests handled at once, and how many more may wait before 429.
HEAVY_SLOTS = 2
HEAVY_QUEUE = 8
#: Binds in progress above which a filter waits (at most `FILTER_WAIT_S`) for one to finish:
#: kube-scheduler binds in goroutines of their own and starts the next pod's cycle at once,
#: so with one round trip a pod (`filterResult: auto`/`best`) it outran the API's binds on a
#: loaded box: 300-580 binds in flight, each past kube-scheduler's 5 s httpTimeout, retried,
#: and the rate fell 8x (docs/benchmarks.md, issue 39). Waiting in filter slows its
#: scheduling cycle to the rate binds complete. 64: the API worker's connections to the API.
BIND_BACKLOG = 64
#: The longest a filter waits for room; well inside kube-scheduler's httpTimeout (5 s).
FILTER_WAIT_S = 2.0


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


class StateCalls:
    """Where a call into the state runs: on the event loop, or in a thread while a verb runs
    in one (`http` counts them in `in_threads`): that verb may hold the state's lock for a
    whole plan, and the loop must not wait on it."""

    def __init__(self) -> None:
        #: verbs running in worker threads now
        self.in_threads = 0

    async def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        if not self.in_threads:
            return fn(*args)
        return await asyncio.to_thread(fn, *args)


class ClaimLocks:
    """Provisioning of one claim (by /provision or a first consumer's bind) is serialized:
    claim uid -> lock, and how many wait on it (the lock goes with its last user)."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}

    @contextlib.asynccontextmanager
    async def held(self, uids: Iterable[str]) -> AsyncIterator[None]:
        """Hold the locks of these claims (sorted: no two holders deadlock)."""
        keys = sorted(set(uids))
        async with contextlib.AsyncExitStack() as stack:
            for key in keys:
                lock = self._locks.setdefault(key, asyncio.Lock())
                self._users[key] = self._users.get(key, 0) + 1
                stack.callback(self._unused, key)
                await stack.enter_async_context(lock)
            yield

    def _unused(self, key: str) -> None:
        self._users[key] -= 1
        if not self._users[key]:
            del self._users[key], self._locks[key]


class BindsInFlight:
    """Binds (and provisions) in progress, for a clean drain on SIGTERM (`drained`) and for
    filters to wait while too many are (`room`)."""

    def __init__(self, backlog: int = BIND_BACKLOG) -> None:
        self._count = 0
        self._backlog = backlog
        self._idle = asyncio.Event()
        self._idle.set()
        self._room = asyncio.Event()
        self._room.set()

    @property
    def count(self) -> int:
        return self._count

    @contextmanager
    def running(self) -> Iterator[None]:
        self._count += 1
        self._idle.clear()
        if self._count >= self._backlog:
            self._room.clear()
        try:
            yield
        finally:
            self._count -= 1
            if self._count < self._backlog:
                self._room.set()
            if not self._count:
                self._idle.set()

    async def room(self, timeout_s: float = FILTER_WAIT_S) -> bool:
        """Wait until fewer than the backlog are in progress (at most `timeout_s`); False if
        there was still no room then (the caller goes on: a late answer is worse)."""
        if self._room.is_set():
            return True
        try:
            await asyncio.wait_for(self._room.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def drained(self, timeout_s: float) -> bool:
        """Wait until none is in progress (at most `timeout_s`); False if some still are."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


@dataclass
class Handle:
    """What every part of the extender reaches: the state and its config, the API clients
    (None: no API access, the verbs still answer), the metrics, this replica's role (leader
    election, `leadership`), the request limits, and the shared objects above."""

    state: SchedulerState
    api: PodApi | None
    claims_api: ClaimApi | None
    metrics: Metrics
    role: Role
    calls: StateCalls = field(init=False, default_factory=StateCalls)
    limits: wire.Limits = field(init=False)
    claim_locks: ClaimLocks = field(init=False, default_factory=ClaimLocks)
    binds: BindsInFlight = field(init=False, default_factory=BindsInFlight)

    def __post_init__(self) -> None:
        self.limits = wire.Limits(max_body_bytes=self.config.max_request_bytes,
                                  max_nodes=self.config.max_nodes_per_request)

    @property
    def config(self) -> SchedulerConfig:
        return self.state.config

    async def existing_elasticgpu(self, where: str, name: str) -> claims_model.ElasticGPU:
        """An ElasticGPU whose create said AlreadyExists, read back and put in the state."""
        assert self.claims_api is not None
        raw = await self.claims_api.get_elasticgpu(name)
        if raw is None:
            raise BindError(f"{where}: ElasticGPU {name} exists and then does not; retry",
                            definite=False)
        try:
            egpu = egpu_api.elasticgpu_from_object(raw)
        except egpu_api.ElasticGPUObjectError as err:
            raise BindError(f"{where}: {err}", definite=False) from None
        await self.calls(self.state.upsert_elasticgpu, egpu,
                         str((raw.get("metadata") or {}).get("uid") or ""))
        return egpu
