"""A new controller leader reconciles a claim that needs work before its pass over every
existing claim and ElasticGPU (issue 29; docs/architecture.md, "Claims after a controller
takeover"), on the real kube-apiserver with `egpu controller` as a process.

The existing objects are N claims Bound (their own objects say so) whose provisioned
ElasticGPUs still lack their status: the state a controller leaves when it dies between the
ElasticGPU's phase write and the claim's. Each costs the takeover's pass one real write (the
ElasticGPU's phase Bound), so how far the pass had gone is in the API server. A new claim,
created while no controller ran (a claim made during a leader's failover), is provisioned
through the test double of `/provision`, which reads the ElasticGPUs as its call comes: the
new claim must come before the pass is half done (it used to come after every existing
claim, its name sorting last), and the pass must still finish every one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.claims import install_crds
from egpu_testing.controller import PREFIX, ControllerProcess, ProvisionDouble, clean_up
from egpu_testing.pytest_plugin import unique_name
from egpu_testing.waiting import wait_for
from elastic_gpu.api import elasticgpu as api
from elastic_gpu.core.claims.decisions import Bind
from elastic_gpu.core.claims.model import GPUSHARE, provisioned_name
from elastic_gpu.core.claims.pods import CLAIM_PROTECTION_FINALIZER
from elastic_gpu.devcluster.ports import free_ports
from elastic_gpu.kube.client import KubeClient
from elastic_gpu.kube.errors import NotFound

pytestmark = pytest.mark.integration

EXISTING = 300
NODE = "existing-node"
SHARE = {"gpushare.provisioner.elasticgpu.io/gpu-core": 10,
         "gpushare.provisioner.elasticgpu.io/gpu-memory": 4}


async def _existing_claim(client: KubeClient, ns: str, cls: str, i: int) -> str:
    """Claim `a-i`, Bound to `egpu-<uid>`, whose ElasticGPU has no status yet."""
    name = f"a-{i:04d}"
    claim = await client.create(f"{PREFIX}/namespaces/{ns}/elasticgpuclaims", {
        "apiVersion": api.API_VERSION, "kind": api.CLAIM_KIND, "metadata": {"name": name},
        "spec": {"egpuClassName": cls, "resources": {"requests": SHARE}}})
    uid = claim["metadata"]["uid"]
    egpu_name = provisioned_name(api.claim_from_object(claim))
    await client.create(f"{PREFIX}/elasticgpus", {
        "apiVersion": api.API_VERSION, "kind": api.EGPU_KIND, "metadata": {"name": egpu_name},
        "spec": {"capacity": SHARE, "node": NODE, "egpuClassName": cls,
                 "reclaimPolicy": "Delete", "claimRef": {"namespace": ns, "name": name, "uid": uid},
                 "cards": [{"index": i % 8, "uuid": f"GPU-existing-{i % 8}", "milli": 100,
                            "memoryMiB": 4096}]}})
    claim = await client.patch(f"{PREFIX}/namespaces/{ns}/elasticgpuclaims/{name}", {
        "metadata": {"finalizers": [CLAIM_PROTECTION_FINALIZER]},
        "spec": {"elasticGPUName": egpu_name}})
    egpu = api.elasticgpu_from_object(await client.get(f"{PREFIX}/elasticgpus/{egpu_name}"))
    await client.patch(f"{PREFIX}/namespaces/{ns}/elasticgpuclaims/{name}/status", {
        "status": api.claim_status(Bind(egpu_name), claim, "2026-01-01T00:00:00Z", egpu)})
    return egpu_name


async def _make_existing(kubeconfig: Path, ns: str, cls: str) -> list[str]:
    client = KubeClient.from_config(kubeconfig)
    limit = asyncio.Semaphore(16)

    async def one(i: int) -> str:
        async with limit:
            return await _existing_claim(client, ns, cls, i)
    try:
        return list(await asyncio.gather(*(one(i) for i in range(EXISTING))))
    finally:
        await client.close()


async def _remove_existing(kubeconfig: Path, ns: str, egpus: set[str]) -> None:
    """The existing claims without their finalizer, deleted, and their ElasticGPUs (in
    parallel: `clean_up` does it one kubectl at a time, minutes for 300)."""
    client = KubeClient.from_config(kubeconfig)
    limit = asyncio.Semaphore(16)

    async def claim(i: int) -> None:
        path = f"{PREFIX}/namespaces/{ns}/elasticgpuclaims/a-{i:04d}"
        async with limit:
            with contextlib.suppress(NotFound):
                await client.patch(path, {"metadata": {"finalizers": None}})
                await client.delete(path)

    async def egpu(name: str) -> None:
        async with limit:
            with contextlib.suppress(NotFound):
                await client.delete(f"{PREFIX}/elasticgpus/{name}")
    try:
        await asyncio.gather(*(claim(i) for i in range(EXISTING)))
        await asyncio.gather(*(egpu(name) for name in egpus))
    finally:
        await client.close()


@pytest.fixture
def double(k8s_cluster: Any) -> Iterator[ProvisionDouble]:
    install_crds(k8s_cluster)
    (port,) = free_ports(1)
    double = ProvisionDouble(k8s_cluster.kubeconfig, port, node=unique_name("node"), slots=2)
    double.start()
    try:
        yield double
    finally:
        double.stop()


def _phases(k8s_cluster: Any, names: set[str]) -> dict[str, str | None]:
    items = json.loads(k8s_cluster.kubectl("get", "egpu", "-o", "json").stdout)["items"]
    return {e["metadata"]["name"]: (e.get("status") or {}).get("phase")
            for e in items if e["metadata"]["name"] in names}


def test_a_claim_that_needs_work_goes_before_the_takeover_pass(
        k8s_cluster: Any, k8s_namespace: str, double: ProvisionDouble, tmp_path: Path) -> None:
    ns = k8s_namespace
    cls = unique_name("cls")
    k8s_cluster.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": api.API_VERSION, "kind": api.CLASS_KIND, "metadata": {"name": cls},
        "provisioner": GPUSHARE, "reclaimPolicy": "Delete", "egpuBindingMode": "Immediate"}))
    existing: set[str] = set()
    try:
        existing.update(asyncio.run(_make_existing(k8s_cluster.kubeconfig, ns, cls)))
        _takeover(k8s_cluster, ns, cls, double, tmp_path, existing)
    finally:
        asyncio.run(_remove_existing(k8s_cluster.kubeconfig, ns, existing))
        clean_up(k8s_cluster, ns, [cls])


def _takeover(k8s_cluster: Any, ns: str, cls: str, double: ProvisionDouble, tmp_path: Path,
              existing: set[str]) -> None:
    assert set(_phases(k8s_cluster, existing).values()) == {None}
    new = "z-new"  # sorts after every existing claim: the order of the informer's list
    k8s_cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps({
        "apiVersion": api.API_VERSION, "kind": api.CLAIM_KIND, "metadata": {"name": new},
        "spec": {"egpuClassName": cls, "resources": {"requests": SHARE}}}))
    (port,) = free_ports(1)
    ctl = ControllerProcess(k8s_cluster.kubeconfig, port, tmp_path / "controller.log",
                            extender_url=double.url, identity=unique_name("ctl"),
                            lease_name=unique_name("takeover"), lease_namespace=ns)
    ctl.start()
    try:
        wait_for(f"claim {new} Bound", lambda: json.loads(k8s_cluster.kubectl(
            "get", "egpuc", new, "-n", ns, "-o", "json").stdout).get("status", {}).get("phase")
            == "Bound", 60)
        seen = double.egpus_seen[new]
        done_before = sum(1 for e in seen if e["metadata"]["name"] in existing
                          and (e.get("status") or {}).get("phase") == "Bound")
        print(f"existing ElasticGPUs the pass had bound when {new} was provisioned: "
              f"{done_before}/{EXISTING}")
        assert done_before < EXISTING // 2, ctl.log_tail()
        # and the pass still finishes what the last leader left
        wait_for("the pass to bind every existing ElasticGPU",
                 lambda: set(_phases(k8s_cluster, existing).values()) == {"Bound"}, 120)
    finally:
        ctl.stop()
