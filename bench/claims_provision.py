"""`POST /provision` against the real API server: claims provisioned per second and latency.

Real control plane (etcd, kube-apiserver, kwok), the Elastic GPU API's CRDs and `egpu
scheduler` as a subprocess, as in the integration tests (no kube-scheduler: nothing schedules
pods here). `--claims` claims of one `gpushare` class (a 10% share each) are created first and
the extender's cache is given time to see them; then `--concurrency` clients (the controller's
workers) call `/provision` once per claim, each a decision, a placement, a reservation and the
ElasticGPU's create in the API server. Latency is per call (HTTP round trip included); claims/s
is claims over the wall time of the whole run. A second pass over the same claims measures the
idempotent answer (`Provisioned`, nothing created).

    .venv/bin/python bench/claims_provision.py --claims 500 --concurrency 8 --nodes 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from egpu_testing.claims import claim_object, class_object, install_crds
from egpu_testing.cluster import TestCluster
from egpu_testing.workbench import ExtenderProcess, metric_value, metrics_text
from elastic_gpu.api import elasticgpu as api
from elastic_gpu.core.model import Card, Node
from elastic_gpu.devcluster.nodes import register_fake_nodes
from elastic_gpu.devcluster.ports import free_ports
from elastic_gpu.kube.transport import RestClient

NAMESPACE = "default"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def create_claims(kubeconfig: Path, count: int, concurrency: int) -> list[dict[str, Any]]:
    client = RestClient.from_config(kubeconfig)
    path = f"/apis/{api.API_VERSION}/namespaces/{NAMESPACE}/{api.CLAIM_PLURAL}"
    created: list[dict[str, Any]] = []
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        body = json.dumps(claim_object(f"c{i:05d}", {
            "gpushare.provisioner.elasticgpu.io/gpu-core": 10}, class_name="bench")).encode()
        async with gate:
            created.append(json.loads(await client.request("POST", path, body=body)))

    try:
        await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        await client.close()
    return created


async def provision_all(url: str, claims: list[dict[str, Any]], concurrency: int
                        ) -> tuple[list[float], float, dict[str, int]]:
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for claim in claims:
        queue.put_nowait(claim)
    latencies: list[float] = []
    results: dict[str, int] = {}

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            meta = queue.get_nowait()["metadata"]
            body = {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}
            started = time.perf_counter()
            async with session.post(f"{url}/provision", json=body) as response:
                answer = await response.json()
            latencies.append(time.perf_counter() - started)
            key = f"{response.status} {answer.get('result', answer.get('Error', ''))[:40]}"
            results[key] = results.get(key, 0) + 1

    started = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return latencies, time.perf_counter() - started, results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="egpu-claims-bench-"))
    plane = TestCluster(work_dir=work / "k8s", die_with_parent=True)
    plane.start(scheduler=False, kwok_enabled=True)
    extender: ExtenderProcess | None = None
    try:
        from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd

        ensure_crd(plane.kube())
        install_crds(plane)
        plane.kubectl("create", "-f", "-", input=json.dumps(class_object("bench")))
        (port,) = free_ports(1)
        extender = ExtenderProcess(plane.kubeconfig, port, work / "extender.log")
        extender.start()
        nodes = [Node(f"n{i:03d}", 96_000, 786_432,
                      tuple(Card(c, f"GPU-n{i:03d}-{c}", "A100-SXM4-80GB", 81920)
                            for c in range(8))) for i in range(args.nodes)]
        register_fake_nodes(plane.kube(), nodes)
        deadline = time.monotonic() + 60
        last = ("elasticgpu_scheduler_card_compute_allocated_millicards"
                f'{{device_index="7",node="{nodes[-1].name}"}}')
        while metric_value(metrics_text(extender.url), last) is None:
            assert time.monotonic() < deadline, "the extender never saw the nodes"
            time.sleep(0.2)
        claims = asyncio.run(create_claims(plane.kubeconfig, args.claims, 16))
        time.sleep(3)  # the extender's watch sees them (a miss would cost a GET each)
        print(f"# {platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}"
              f", {args.claims} claims, {args.nodes} nodes x 8 cards, concurrency "
              f"{args.concurrency}", flush=True)
        print(f"{'pass':12} {'claims/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
              f"{'mean ms':>8}  answers")
        for label in ("provision", "idempotent"):
            latencies, wall, results = asyncio.run(
                provision_all(extender.url, claims, args.concurrency))
            ms = [t * 1000 for t in latencies]
            print(f"{label:12} {len(ms) / wall:9.1f} {pct(ms, 0.5):8.1f} {pct(ms, 0.99):8.1f} "
                  f"{max(ms):8.1f} {statistics.fmean(ms):8.1f}  {results}", flush=True)
        held = sum(metric_value(metrics_text(extender.url),
                                f'elasticgpu_scheduler_elasticgpus_held{{node="{n.name}"}}') or 0
                   for n in nodes)
        print(f"# ElasticGPUs held in the extender's ledger: {held:.0f}")
    finally:
        if extender is not None:
            extender.stop()
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
