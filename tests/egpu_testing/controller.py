"""`egpu controller` as a subprocess (SIGKILL-able like a crashed pod), and a test double of
the extender's `POST /provision` (contract section 2) that creates the ElasticGPU in the real
API server with fixed cards, so the controller's provisioning path is tested without the
extender."""

from __future__ import annotations

import asyncio
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from egpu_testing.process import SupervisedProcess
from elastic_gpu.api import elasticgpu as api
from elastic_gpu.core.assignment import CardShare
from elastic_gpu.core.claims import decisions as claim_decisions
from elastic_gpu.core.claims import model as claim_model
from elastic_gpu.core.claims.binding import decide
from elastic_gpu.core.claims.decisions import Bind, Provision
from elastic_gpu.core.claims.model import ClaimRef, ElasticGPUPhase, PendingReason, provisioned_name
from elastic_gpu.kube.client import KubeClient
from elastic_gpu.kube.errors import AlreadyExists, NotFound

PREFIX = f"/apis/{api.GROUP}/{api.VERSION}"


class ControllerProcess(SupervisedProcess):
    what = "egpu controller"

    def __init__(self, kubeconfig: Path, metrics_port: int, log_path: Path, *,
                 extender_url: str, identity: str, lease_name: str = "egpu-controller",
                 lease_namespace: str = "kube-system", lease: Sequence[float] = (15, 10, 2),
                 extra: Sequence[str] = ()) -> None:
        super().__init__(log_path)
        self.kubeconfig = kubeconfig
        self.port = metrics_port
        self.extender_url = extender_url
        self.identity = identity
        self.lease_name = lease_name
        self.lease_namespace = lease_namespace
        self.lease = tuple(lease)
        self.extra = tuple(extra)
        self.starts = 0

    def start(self, timeout_s: float = 60.0) -> None:
        duration, deadline, retry = self.lease
        argv = [str(Path(sys.executable).with_name("egpu")), "controller",
                "--kubeconfig", str(self.kubeconfig), "--extender-url", self.extender_url,
                "--identity", self.identity, "--lease-name", self.lease_name,
                "--lease-namespace", self.lease_namespace, "--lease-duration", str(duration),
                "--renew-deadline", str(deadline), "--retry-period", str(retry),
                "--metrics-port", str(self.port), "--log-level", "DEBUG", *self.extra]
        self.starts += 1
        self.launch(argv, timeout_s, header=f"---- start {self.starts}: {' '.join(argv)}\n")

    def _get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}",
                                        timeout=2) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, ""
        except OSError:
            return 0, ""

    def ready(self) -> bool:
        return self._get("/healthz")[0] == 200

    def leading(self) -> bool:
        """Leads, caches synced, reconciling (/readyz)."""
        return self._get("/readyz")[0] == 200

    def metrics(self) -> str:
        return self._get("/metrics")[1]


class ProvisionDouble:
    """`POST /provision` as contract section 2 says, with a node `node` of `slots` cards:
    reads the claim, its class and the ElasticGPUs from the API server, runs
    `core.claims.binding.decide`, and creates `egpu-<uid>` on card k (the first card no ElasticGPU
    holds) with the claim's share of it, or answers Pending/Unschedulable when every card is
    held. Serialized (one provisioning at a time). Runs its own event loop in a thread."""

    def __init__(self, kubeconfig: Path, port: int, node: str = "double-node",
                 slots: int = 2) -> None:
        self.kubeconfig = kubeconfig
        self.port = port
        self.node = node
        self.slots = slots
        self.calls = 0
        self.created: list[str] = []
        #: claim name -> the ElasticGPUs as its first call read them from the API server
        #: (what the controller had finished when it came to this claim)
        self.egpus_seen: dict[str, list[dict[str, Any]]] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._client: KubeClient | None = None
        self._lock: asyncio.Lock | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _start(self) -> None:
        self._client = KubeClient.from_config(self.kubeconfig)
        self._lock = asyncio.Lock()
        app = web.Application()
        app.router.add_post("/provision", self._provision)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._client is not None:
            await self._client.close()

    async def _provision(self, request: web.Request) -> web.Response:
        assert self._client is not None and self._lock is not None
        body = await request.json()
        for field in ("namespace", "name", "uid"):
            if not isinstance(body.get(field), str) or not body[field]:
                return web.json_response({"error": f"{field}: required string"}, status=400)
        self.calls += 1
        async with self._lock:
            return web.json_response(await self._decide(body))

    async def _decide(self, body: dict[str, Any]) -> dict[str, Any]:
        assert self._client is not None
        client = self._client
        try:
            claim_obj = await client.get(
                f"{PREFIX}/namespaces/{body['namespace']}/elasticgpuclaims/{body['name']}")
        except NotFound:
            raise web.HTTPNotFound(text="claim not found") from None
        claim = api.claim_from_object(claim_obj)
        if claim.uid != body["uid"]:
            raise web.HTTPNotFound(text="claim uid differs")
        classes = {c.name: c for c in map(api.class_from_object,
                                           (await client.list(f"{PREFIX}/elasticgpuclasses"))[0])}
        egpu_objs = (await client.list(f"{PREFIX}/elasticgpus"))[0]
        self.egpus_seen.setdefault(claim.name, egpu_objs)
        egpus = {e.name: e for e in map(api.elasticgpu_from_object, egpu_objs)}
        decision = decide(claim, classes, egpus)
        if isinstance(decision, Bind) and decision.elastic_gpu == provisioned_name(claim):
            egpu = egpus[decision.elastic_gpu]
            return {"result": "Provisioned", "elasticGPU": egpu.name, "node": egpu.node}
        if isinstance(decision, claim_decisions.Pending):
            return {"result": "Pending", "reason": decision.reason.value,
                    "message": decision.message}
        if not isinstance(decision, Provision):
            name = getattr(decision, "elastic_gpu", "")
            return {"result": "NotNeeded", "decision": type(decision).__name__, "elasticGPU": name}
        held = {share.index for e in egpus.values() if e.node == self.node for share in e.shares}
        free = [k for k in range(self.slots) if k not in held]
        if not free:
            return {"result": "Pending", "reason": PendingReason.UNSCHEDULABLE.value,
                    "message": f"cannot provision claim {claim.key}: 0/1 nodes can host it "
                               f"({self.node}: all {self.slots} cards held)"}
        container = decision.request.containers[0]
        cls = classes[claim.class_name or ""]
        egpu = claim_model.ElasticGPU(
            name=provisioned_name(claim), capacity=dict(claim.requests), node=self.node,
            shares=(CardShare(free[0], f"GPU-double-{free[0]}", container.compute_milli or 1000,
                              container.memory_mib),),
            claim_ref=ClaimRef.of(claim), class_name=cls.name,
            reclaim_policy=cls.reclaim_policy, phase=ElasticGPUPhase.BOUND)
        obj = api.elasticgpu_to_object(egpu)
        obj.pop("status")
        try:
            await client.create(f"{PREFIX}/elasticgpus", obj)
            self.created.append(egpu.name)
        except AlreadyExists:
            pass
        return {"result": "Provisioned", "elasticGPU": egpu.name, "node": self.node}


def clean_up(k8s_cluster: Any, namespace: str, classes: Sequence[str] = (),
             egpus: Sequence[str] = ()) -> None:
    """After a test (its controller stopped): the namespace's claims without their finalizer
    (or the namespace would stay Terminating), the ElasticGPUs made for them and the named
    cluster-scoped objects, so that later tests see a clean cluster."""
    import json

    listed = json.loads(k8s_cluster.kubectl("get", "egpuc", "-n", namespace, "-o", "json",
                                            check=False).stdout or '{"items": []}')
    for claim in listed["items"]:
        k8s_cluster.kubectl("patch", "egpuc", claim["metadata"]["name"], "-n", namespace,
                            "--type=merge", "-p", '{"metadata": {"finalizers": null}}',
                            check=False)
        k8s_cluster.kubectl("delete", "egpuc", claim["metadata"]["name"], "-n", namespace,
                            "--wait=false", check=False)
    listed = json.loads(k8s_cluster.kubectl("get", "egpu", "-o", "json",
                                            check=False).stdout or '{"items": []}')
    made = [e["metadata"]["name"] for e in listed["items"]
            if (e["spec"].get("claimRef") or {}).get("namespace") == namespace]
    for name in {*made, *egpus}:
        k8s_cluster.kubectl("delete", "egpu", name, "--wait=false", "--ignore-not-found",
                            check=False)
    for name in classes:
        k8s_cluster.kubectl("delete", "egpuclass", name, "--ignore-not-found", "--wait=false",
                            check=False)
