"""Loading a new cluster for benches: thousands of fake nodes and their pods, many at a time.

`devcluster.nodes.register_fake_nodes(new=True)` registers each node by blocking calls, a
few threads at a time. Here the same requests are sent from one event loop, many in flight
at once over kept-alive connections, and nothing is decoded but the one field a later
request needs: 10-20 % less CPU per node, the loader's and kube-apiserver's together
(`bench/cluster_load.py`; kube-apiserver's CPU per write is most of what is left).

The requests are the sandbox's own: `devcluster.nodes.create_fake_node` runs against a
`RequestRecorder` that keeps what it would send (the Node with its status, each GPUDevice,
its status patch) and answers the Node's create with a placeholder uid; `Loader` sends them
for real and puts the Node's uid where the placeholder stood (the GPUDevices' owner
reference). So a loaded node is the node `devcluster` registers, through devcluster's public
function only (tests/unit/devcluster/test_bench_bulkload.py compares the two).

Pods are created bound (`spec.nodeName` set), one request each. Their status is what the
API server gives a new pod: it drops the status of a create (a Node's it keeps, so a Node is
complete in one request).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import msgspec

from elastic_gpu.core.model import Node
from elastic_gpu.devcluster.nodes import (
    AgentConfigLike,
    create_fake_node,
    install_gpudevice_crd_once,
)
from elastic_gpu.kube.client import MERGE_PATCH
from elastic_gpu.kube.errors import AlreadyExists, translate
from elastic_gpu.kube.resources import NODES, PODS
from elastic_gpu.kube.sync import SyncKubeClient
from elastic_gpu.kube.transport import ApiStatusError, RestClient

#: Requests in flight (one kept-alive connection each): enough to keep kube-apiserver and
#: etcd busy, few enough not to trip its max-mutating-requests-inflight (200).
DEFAULT_CONCURRENCY = 48
#: A request that failed without a definite answer (timeout, 429, 5xx) is sent again this
#: many times, each after twice the pause of the one before.
RETRIES = 6
FIRST_PAUSE_S = 0.5
#: What the recorder answers as the uid of a Node it "created"; replaced by the real one.
UID_PLACEHOLDER = "bulkload-uid-of-"


class Request(NamedTuple):
    method: str
    path: str
    body: dict[str, Any]
    content_type: str


class RequestRecorder(SyncKubeClient):
    """Stands in for the API server while devcluster builds a node's requests: keeps every
    create and patch, answers a create with a placeholder uid (`UID_PLACEHOLDER` + name) and
    every read with an Established CRD (devcluster installs the GPUDevice CRD on a client's
    first use: on the recorder that is a no-op, the loader installs it for real). Other verbs
    (list, delete) are not recorded: the base class's, with no event loop, they fail loudly, so
    a registration that starts to read (a DRA node's, say) cannot be replayed by mistake."""

    def __init__(self, uid: Callable[[str], str] | None = None) -> None:
        # No event loop: nothing here talks to a server.
        self.requests: list[Request] = []
        self._uid = uid or (lambda name: UID_PLACEHOLDER + name)
        install_gpudevice_crd_once(self)
        self.requests.clear()

    def create(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        body = msgspec.json.decode(msgspec.json.encode(obj))  # a copy: the caller may reuse obj
        self.requests.append(Request("POST", path, body, "application/json"))
        name = str(obj["metadata"]["name"])
        return {**body, "metadata": {**body["metadata"], "uid": self._uid(name)}}

    def patch(self, path: str, patch: Any, content_type: str = MERGE_PATCH,
              params: Mapping[str, str] | None = None) -> dict[str, Any]:
        body = msgspec.json.decode(msgspec.json.encode(patch))
        self.requests.append(Request("PATCH", path, body, content_type))
        return {}

    def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        return {"status": {"conditions": [{"type": "Established", "status": "True"}]}}

    def take(self) -> list[Request]:
        taken, self.requests = self.requests, []
        return taken

    def close(self) -> None:
        """Nothing to close: the recorder holds no connection (the client interface asks it)."""


def node_requests(inventory: Node, agent_config: AgentConfigLike | None = None,
                  recorder: RequestRecorder | None = None) -> list[Request]:
    """What `devcluster.nodes.create_fake_node` sends to register `inventory` in a new
    cluster, in its order; the Node's uid is `UID_PLACEHOLDER` + its name."""
    recorder = recorder or RequestRecorder()
    recorder.take()
    create_fake_node(recorder, inventory, agent_config)
    return recorder.take()


def pod_request(pod: Mapping[str, Any]) -> Request:
    """A pod's create: as given, less the uid and resourceVersion the API server assigns."""
    body = msgspec.json.decode(msgspec.json.encode(pod))
    body["metadata"].pop("uid", None)
    body["metadata"].pop("resourceVersion", None)
    return Request("POST", PODS.path(body["metadata"]["namespace"]), body, "application/json")


class Transport(Protocol):
    """The part of `kube.transport.RestClient` the loader uses (a double in unit tests)."""

    async def request(self, method: str, path: str, *, body: bytes | None = None,
                      params: Mapping[str, str] | None = None,
                      content_type: str = "application/json") -> bytes: ...


@dataclass
class LoadReport:
    nodes: int = 0
    pods: int = 0
    requests: int = 0
    retries: int = 0
    seconds: float = 0.0
    started: float = 0.0  # time.monotonic() at the start


class _Uid(msgspec.Struct):
    class _Meta(msgspec.Struct):
        uid: str = ""

    metadata: _Meta = msgspec.field(default_factory=_Meta)


#: One unit of work: the requests of a node (in order), or a pod's one request.
Job = list[Request]


class Loader:
    """Sends jobs, `concurrency` requests in flight; a job's requests go one after another
    (a GPUDevice needs its Node's uid; its status patch needs it created)."""

    def __init__(self, transport: Transport, *, params: Mapping[str, str] | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.transport = transport
        self.params = dict(params or {})
        self.sleep = sleep
        self.report = LoadReport()

    async def run(self, jobs: Iterable[Job], concurrency: int = DEFAULT_CONCURRENCY,
                  progress: Callable[[LoadReport], None] | None = None) -> LoadReport:
        self.report.started = started = time.monotonic()
        source: Iterator[Job] = iter(jobs)  # shared: each worker takes the next job

        async def worker() -> None:
            for job in source:
                await self.send_job(job)
                if progress is not None and (self.report.nodes + self.report.pods) % 10_000 == 0:
                    progress(self.report)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        self.report.seconds = time.monotonic() - started
        return self.report

    async def send_job(self, job: Job) -> None:
        uids: dict[bytes, bytes] = {}  # '"placeholder"' -> '"uid"', as JSON strings
        for request in job:
            data = msgspec.json.encode(request.body)
            for placeholder, quoted_uid in uids.items():
                data = data.replace(placeholder, quoted_uid)
            answer = await self.send(request, data)
            if request.method == "POST" and request.path == NODES.path():
                name = str(request.body["metadata"]["name"])
                uid = answer or await self.node_uid(name)
                uids[msgspec.json.encode(UID_PLACEHOLDER + name)] = msgspec.json.encode(uid)
        if job and job[0].path == NODES.path():
            self.report.nodes += 1
        else:
            self.report.pods += 1

    async def send(self, request: Request, data: bytes) -> str:
        """Send one request, again after a failure without a definite answer; the uid of the
        object a POST created ("" when a resent POST found it created by the first)."""
        pause = FIRST_PAUSE_S
        for attempt in range(RETRIES + 1):
            try:
                raw = await self.transport.request(request.method, request.path, body=data,
                                                   params=self.params,
                                                   content_type=request.content_type)
                self.report.requests += 1
                return msgspec.json.decode(raw, type=_Uid).metadata.uid if raw else ""
            except ApiStatusError as err:
                error = translate(err)
                if attempt > 0 and isinstance(error, AlreadyExists):
                    return ""  # the attempt before was applied after all
                if error.definite or attempt == RETRIES:
                    raise error from None
                self.report.retries += 1
                await self.sleep(pause)
                pause *= 2
        raise AssertionError("unreachable")

    async def node_uid(self, name: str) -> str:
        raw = await self.transport.request("GET", NODES.path(name=name))
        return msgspec.json.decode(raw, type=_Uid).metadata.uid


def jobs_for(inventories: Iterable[Node], pods: Iterable[Mapping[str, Any]],
             agent_config: AgentConfigLike | None = None) -> Iterator[Job]:
    """The nodes' jobs, then the pods'; built as they are taken (15,000 nodes' requests
    would hold a few hundred MiB)."""
    recorder = RequestRecorder()
    node_jobs = (node_requests(inv, agent_config, recorder) for inv in inventories)
    pod_jobs = ([pod_request(pod)] for pod in pods)
    return itertools.chain(node_jobs, pod_jobs)


def load_cluster(kubeconfig: Path, inventories: Iterable[Node],
                 pods: Iterable[Mapping[str, Any]] = (), *,
                 concurrency: int = DEFAULT_CONCURRENCY,
                 agent_config: AgentConfigLike | None = None,
                 field_manager: str | None = "egpu-dev",
                 progress: Callable[[LoadReport], None] | None = None) -> LoadReport:
    """Fill a new cluster (none of the nodes or pods exists yet) with the fake nodes as
    devcluster registers them and with `pods`; installs the GPUDevice CRD first."""
    with SyncKubeClient.from_config(kubeconfig, field_manager=field_manager) as kube:
        install_gpudevice_crd_once(kube)

    async def run() -> LoadReport:
        # A generous timeout: on a busy box a create may wait seconds behind the others.
        rest = RestClient.from_config(kubeconfig, timeout_s=120.0, max_connections=concurrency)
        params = {"fieldManager": field_manager} if field_manager else {}
        try:
            return await Loader(rest, params=params).run(
                jobs_for(inventories, pods, agent_config), concurrency, progress)
        finally:
            await rest.close()

    return asyncio.run(run())
