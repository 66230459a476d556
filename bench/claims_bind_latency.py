"""Claim -> Bound latency and claims per second through `egpu controller` and the extender's
`POST /provision` (issue 15, must-show 5; goal p99 <= 1 s at 100 claims/s).

    egpu sandbox up --gpu-nodes 4 --gpus-per-node 8 --kubeconfig /tmp/sb.kubeconfig
    PYTHONPATH=src:tests .venv/bin/python bench/claims_bind_latency.py \\
        --kubeconfig /tmp/sb.kubeconfig --claims 500 --rate 100

Against a running system (the sandbox runs the extender and the controller): creates an
Immediate, reclaim-Delete class and `--claims` claims (gpu-core `--core`, gpu-memory 4) at
`--rate` per second in a namespace of its own, paced on the client, and watches them; a
claim's latency is from the moment its create is sent to the watch event that shows it Bound
(so it includes the create itself, the controller's reaction, /provision, the ElasticGPU's
creation and the three binding writes). Prints a Markdown row; then deletes what it made.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from elastic_gpu.k8s import elasticgpu as api
from elastic_gpu.kube.client import KubeClient

PREFIX = f"/apis/{api.GROUP}/{api.VERSION}"


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(kubeconfig: Path, claims: int, rate: float, core: int, timeout_s: float
              ) -> dict[str, Any]:
    client = KubeClient.from_config(kubeconfig, max_connections=128)
    tag = uuid.uuid4().hex[:6]
    ns, cls = f"bench-claims-{tag}", f"bench-{tag}"
    await client.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": ns}})
    await client.create(f"{PREFIX}/elasticgpuclasses", {
        "apiVersion": api.API_VERSION, "kind": api.CLASS_KIND, "metadata": {"name": cls},
        "provisioner": "gpushare.provisioner.elasticgpu.io", "reclaimPolicy": "Delete"})
    sent: dict[str, float] = {}
    bound: dict[str, float] = {}
    done = asyncio.Event()
    _, version = await client.list(f"{PREFIX}/namespaces/{ns}/elasticgpuclaims")

    async def watch() -> None:
        async for kind, obj in client.watch(f"{PREFIX}/namespaces/{ns}/elasticgpuclaims",
                                            version, timeout_s=int(timeout_s) + 60):
            name = (obj.get("metadata") or {}).get("name")
            if kind in ("ADDED", "MODIFIED") and name not in bound and \
                    (obj.get("status") or {}).get("phase") == "Bound":
                bound[name] = time.perf_counter()
                if len(bound) == claims:
                    done.set()
                    return

    watcher = asyncio.create_task(watch())

    async def create(i: int) -> None:
        name = f"c{i:05d}"
        sent[name] = time.perf_counter()
        await client.create(f"{PREFIX}/namespaces/{ns}/elasticgpuclaims", {
            "apiVersion": api.API_VERSION, "kind": api.CLAIM_KIND, "metadata": {"name": name},
            "spec": {"egpuClassName": cls, "resources": {"requests": {
                "gpushare.provisioner.elasticgpu.io/gpu-core": core,
                "gpushare.provisioner.elasticgpu.io/gpu-memory": 4}}}})

    started = time.perf_counter()
    creates = []
    for i in range(claims):
        delay = started + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        creates.append(asyncio.create_task(create(i)))
    await asyncio.gather(*creates)
    created_s = time.perf_counter() - started
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), timeout_s)
    watcher.cancel()
    latencies = [bound[n] - sent[n] for n in bound]
    result = {
        "claims": claims, "rate": rate, "bound": len(bound), "created_s": created_s,
        "p50": quantile(latencies, 0.5) if latencies else float("nan"),
        "p99": quantile(latencies, 0.99) if latencies else float("nan"),
        "max": max(latencies, default=float("nan")),
        "mean": statistics.fmean(latencies) if latencies else float("nan"),
        "per_s": len(bound) / (max(bound.values()) - started) if bound else 0.0,
    }
    # free the cards before the next run: claims deleted, then their ElasticGPUs (reclaim
    # Delete) gone, then the namespace
    for name in sent:
        with contextlib.suppress(Exception):
            await client.delete(f"{PREFIX}/namespaces/{ns}/elasticgpuclaims/{name}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        items, _ = await client.list(f"{PREFIX}/elasticgpus")
        if not any((e["spec"].get("claimRef") or {}).get("namespace") == ns for e in items):
            break
        await asyncio.sleep(0.5)
    await client.delete(f"/api/v1/namespaces/{ns}")
    await client.delete(f"{PREFIX}/elasticgpuclasses/{cls}")
    await client.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--claims", type=int, default=500)
    parser.add_argument("--rate", type=float, default=100.0, help="claims created per second")
    parser.add_argument("--core", type=int, default=5, help="gpu-core of each claim (percent)")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    r = asyncio.run(run(args.kubeconfig, args.claims, args.rate, args.core, args.timeout))
    print("| claims | offered rate | created in | bound | p50 | p99 | max | bound per second |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {r['claims']} | {r['rate']:.0f}/s | {r['created_s']:.2f} s | {r['bound']} | "
          f"{r['p50'] * 1e3:.0f} ms | {r['p99'] * 1e3:.0f} ms | {r['max'] * 1e3:.0f} ms | "
          f"{r['per_s']:.0f} |")


if __name__ == "__main__":
    main()
