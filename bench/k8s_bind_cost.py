"""CPU per Binding from Python: lightkube's async client vs the lean client (`kube.transport`), against
the development control plane. The scheduler's API worker creates one Binding per pod, so on a
box shared with the control plane this CPU is scheduling throughput.

    .venv/bin/python bench/k8s_bind_cost.py --binds 400 --rounds 2

Per round and client: `--binds` pods are created unscheduled, then bound 16 at a time; prints
this process's CPU per Binding (user + system) and the wall rate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from egpu_testing.cluster import TestCluster
from egpu_testing.scenario import create_pods
from egpu_testing.workbench import pod_manifest
from elastic_gpu.devcluster.nodes import register_fake_nodes, uniform_inventories
from elastic_gpu.kube.transport import RestClient
from elastic_gpu.scheduler.apiworker import binding_body

NOTES = {"elasticgpu.io/assigned-node": "x"}


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def bind_lightkube(kubeconfig: Path, namespace: str, names: list[str], node: str) -> None:
    from lightkube import AsyncClient, KubeConfig
    from lightkube.models.core_v1 import ObjectReference
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Pod

    client: Any = AsyncClient(config=KubeConfig.from_file(str(kubeconfig)), trust_env=False)
    gate = asyncio.Semaphore(16)

    async def one(name: str) -> None:
        binding = Pod.Binding(metadata=ObjectMeta(name=name, namespace=namespace,
                                                  annotations=NOTES),
                              target=ObjectReference(apiVersion="v1", kind="Node", name=node))
        async with gate:
            # the API answers 201 with a Status, which lightkube then fails to decode
            with contextlib.suppress(msgspec.ValidationError):
                await client.create(binding, name=name, namespace=namespace)

    await asyncio.gather(*(one(n) for n in names))
    await client.close()


async def bind_rest(kubeconfig: Path, namespace: str, names: list[str], node: str) -> None:
    client = RestClient.from_config(kubeconfig)
    gate = asyncio.Semaphore(16)

    async def one(name: str) -> None:
        async with gate:
            await client.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
                                 body=binding_body(namespace, name, "", node, None, NOTES))

    await asyncio.gather(*(one(n) for n in names))
    await client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binds", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="egpu-bindcost-") as tmp:
        plane = TestCluster(work_dir=Path(tmp) / "k8s", die_with_parent=True)
        plane.start(scheduler=False, kwok_enabled=True)
        try:
            client = plane.client()
            (inventory,) = uniform_inventories(1, prefix="bind", gpus=8)
            register_fake_nodes(plane.kube(), [inventory])
            for r in range(args.rounds):
                for label, bind in (("lightkube", bind_lightkube), ("kube.transport", bind_rest)):
                    namespace = f"{label.replace('.', '-')}-{r}"
                    plane.kubectl("create", "namespace", namespace)
                    names = [f"p{i}" for i in range(args.binds)]
                    create_pods(client, [pod_manifest(n, namespace, scheduler_name="nobody")
                                         for n in names])
                    cpu0, wall0 = cpu_seconds(), time.monotonic()
                    asyncio.run(bind(plane.kubeconfig, namespace, names, inventory.name))
                    cpu, wall = cpu_seconds() - cpu0, time.monotonic() - wall0
                    print(f"round {r} {label}: {cpu / args.binds * 1000:.2f} ms CPU per Binding, "
                          f"{args.binds / wall:.0f} Bindings/s", flush=True)
        finally:
            plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
