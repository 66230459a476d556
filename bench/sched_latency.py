"""Extender filter + prioritize latency over HTTP at 1,000 and 5,000 nodes (nodeCacheCapable).

The extender's aiohttp server runs in this process on a loopback port; requests are sent one
at a time, as kube-scheduler does (one scheduling cycle at a time), with every node's name in
`NodeNames` (the worst case: percentageOfNodesToScore=100). Nodes have 8 cards of 80 GiB, half
of them partly used, so filter and score work on a realistic mix.

    .venv/bin/python bench/sched_latency.py --nodes 1000 5000 --requests 400
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time

import aiohttp
from aiohttp import web

from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.scheduler.server import Extender
from elastic_gpu.scheduler.state import SchedulerState
from elastic_gpu.scheduler.workbench import pod_manifest, ready_state


def cluster(count: int, rng: random.Random) -> SchedulerState:
    nodes = [Node(f"node-{i:05d}", 96_000, 786_432,
                  tuple(Card(c, f"GPU-{i}-{c}", "A100-SXM4-80GB", 81920) for c in range(8)))
             for i in range(count)]
    state = ready_state(nodes)
    # Background load: about half the cards carry a 10-90% share.
    for i in range(count * 4):
        pod = pod_manifest(f"bg-{i}", uid=f"bg-{i}",
                           limits={"elasticgpu.io/gpu-core": str(rng.randrange(10, 91, 10)),
                                   "elasticgpu.io/gpu-memory": str(rng.randrange(1, 40) * 1024)})
        try:
            state.reserve(pod_request_from_manifest(pod), f"bg-{i}", f"node-{rng.randrange(count):05d}")
            state.confirm(f"bg-{i}")
        except Exception:
            pass
    return state


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(count: int, requests: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    state = cluster(count, rng)
    runner = web.AppRunner(Extender(state).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    names = state.node_names()
    filt: list[float] = []
    prio: list[float] = []
    both: list[float] = []
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:
        for i in range(requests + 20):
            pod = pod_manifest(f"p{i}", uid=f"p{i}", limits={
                "elasticgpu.io/gpu-core": str(rng.choice([10, 25, 50, 100, 200])),
                "elasticgpu.io/gpu-memory": str(rng.randrange(1, 20) * 1024)})
            t0 = time.perf_counter()
            async with session.post("/filter", data=json.dumps(
                    {"Pod": pod, "Nodes": None, "NodeNames": names})) as resp:
                result = await resp.json()
            t1 = time.perf_counter()
            async with session.post("/prioritize", data=json.dumps(
                    {"Pod": pod, "Nodes": None, "NodeNames": result["NodeNames"]})) as resp:
                await resp.json()
            t2 = time.perf_counter()
            if i >= 20:  # warm-up excluded
                filt.append(t1 - t0)
                prio.append(t2 - t1)
                both.append(t2 - t0)
    await runner.cleanup()
    ms = 1000.0
    return {"nodes": count, "filter_p50_ms": statistics.median(filt) * ms,
            "filter_p99_ms": pct(filt, 0.99) * ms,
            "prioritize_p50_ms": statistics.median(prio) * ms,
            "prioritize_p99_ms": pct(prio, 0.99) * ms,
            "both_p50_ms": statistics.median(both) * ms, "both_p99_ms": pct(both, 0.99) * ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print("| nodes | filter p50 | filter p99 | prioritize p50 | prioritize p99 | "
          "filter+prioritize p50 | filter+prioritize p99 |")
    print("|---|---|---|---|---|---|---|")
    for count in args.nodes:
        r = asyncio.run(run(count, args.requests, args.seed))
        print(f"| {count} | {r['filter_p50_ms']:.2f} ms | {r['filter_p99_ms']:.2f} ms | "
              f"{r['prioritize_p50_ms']:.2f} ms | {r['prioritize_p99_ms']:.2f} ms | "
              f"{r['both_p50_ms']:.2f} ms | {r['both_p99_ms']:.2f} ms |", flush=True)


if __name__ == "__main__":
    main()
