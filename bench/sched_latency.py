"""Extender filter + prioritize latency over HTTP at 1,000 and 5,000 nodes (nodeCacheCapable).

The extender's aiohttp server runs in this process on a loopback port; requests are sent one
at a time, as kube-scheduler does (one scheduling cycle at a time). Two request sizes:
- `all`: every node's name in `NodeNames` (percentageOfNodesToScore: 100, the worst case);
- `default`: as many names as kube-scheduler's default adaptive sample passes to extenders
  (max(100, N x (50 - N/125)%), at least 5%: 420 of 1,000, 500 of 5,000), rotating.
Nodes have 8 cards of 80 GiB with a background load on about half of them; pods come in six
shapes (10-200% of a card, 4-20 GiB), and after each filter+prioritize the pod is reserved on
the best node, as a bind would, so the engine's per-shape score caches see real churn.

    .venv/bin/python bench/sched_latency.py --nodes 1000 5000 --requests 400
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import time

import aiohttp
import msgspec
from aiohttp import web

from egpu_testing.workbench import pod_manifest, ready_state
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.placement import Unschedulable
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.scheduler.binder import with_binding
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.state import SchedulerState


def cluster(count: int, rng: random.Random, config: SchedulerConfig | None = None
            ) -> SchedulerState:
    nodes = [Node(f"node-{i:05d}", 96_000, 786_432,
                  tuple(Card(c, f"GPU-{i}-{c}", "A100-SXM4-80GB", 81920) for c in range(8)))
             for i in range(count)]
    state = ready_state(nodes, SchedulerState(config))
    # Background load: about half the cards carry a 10-90% share.
    for i in range(count * 4):
        pod = pod_manifest(f"bg-{i}", uid=f"bg-{i}",
                           limits={"elasticgpu.io/gpu-core": str(rng.randrange(10, 91, 10)),
                                   "elasticgpu.io/gpu-memory": str(rng.randrange(1, 40) * 1024)})
        try:
            node = f"node-{rng.randrange(count):05d}"
            token, done = state.reserve(pod_request_from_manifest(pod), f"bg-{i}", node)
            state.settle(f"bg-{i}", token, "bound", with_binding(pod, node, done))
        except Unschedulable:
            pass  # background filler: a random pod that does not fit this node is just skipped
    return state


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


SHAPES = ((10, 4096), (25, 8192), (50, 16384), (30, 4096), (100, 20480), (200, 0))


def sample_size(count: int) -> int:
    """kube-scheduler's numFeasibleNodesToFind with the default percentageOfNodesToScore."""
    if count < 100:
        return count
    percentage = max(5, 50 - count // 125)
    return max(100, count * percentage // 100)


async def run(count: int, requests: int, seed: int, mode: str, filter_result: str
              ) -> dict[str, float]:
    rng = random.Random(seed)
    # only "best" names the option, so this script also measures code from before it existed
    state = cluster(count, rng, SchedulerConfig(filterResult="best") if filter_result == "best"
                    else SchedulerConfig())
    prioritize = filter_result == "all"
    encode = msgspec.json.encode
    decode = msgspec.json.decode
    runner = web.AppRunner(Extender(state).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    names = state.node_names()
    window = len(names) if mode == "all" else sample_size(len(names))
    start = 0
    filt: list[float] = []
    prio: list[float] = []
    both: list[float] = []
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:
        for i in range(requests + 20):
            percent, memory = rng.choice(SHAPES)
            limits = {"elasticgpu.io/gpu-core": str(percent)}
            if memory:
                limits["elasticgpu.io/gpu-memory"] = str(memory)
            pod = pod_manifest(f"p{i}", uid=f"p{i}", limits=limits)
            asked = (names + names)[start:start + window]
            start = (start + window) % len(names)
            t0 = time.perf_counter()
            # msgspec on the client: kube-scheduler's Go encoding/json is far closer to it than
            # to Python's json module, whose 5,000-name round trips would dominate the figure.
            async with session.post("/filter", data=encode(
                    {"Pod": pod, "Nodes": None, "NodeNames": asked})) as resp:
                result = decode(await resp.read())
            t1 = time.perf_counter()
            if prioritize:
                async with session.post("/prioritize", data=encode(
                        {"Pod": pod, "Nodes": None, "NodeNames": result["NodeNames"]})) as resp:
                    scores = decode(await resp.read())
            else:  # filterResult: best: the one node left is the choice, nothing to score
                scores = [{"Host": h, "Score": 10} for h in result["NodeNames"] or ()]
            t2 = time.perf_counter()
            if scores:
                best = max(scores, key=lambda h: h["Score"])["Host"]
                token, done = state.reserve(pod_request_from_manifest(pod), f"p{i}", best)
                state.settle(f"p{i}", token, "bound", with_binding(pod, best, done))
            if i >= 20:  # warm-up excluded
                filt.append(t1 - t0)
                prio.append(t2 - t1)
                both.append(t2 - t0)
    await runner.cleanup()
    ms = 1000.0
    return {"nodes": count, "names": window, "filter_p50_ms": statistics.median(filt) * ms,
            "filter_p99_ms": pct(filt, 0.99) * ms,
            "prioritize_p50_ms": statistics.median(prio) * ms,
            "prioritize_p99_ms": pct(prio, 0.99) * ms,
            "both_p50_ms": statistics.median(both) * ms, "both_p99_ms": pct(both, 0.99) * ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--modes", nargs="+", default=["default", "all"],
                        choices=["default", "all"])
    parser.add_argument("--filter-result", nargs="+", default=["all", "best"],
                        choices=["all", "best"],
                        help="extender filterResult: all (filter + prioritize) or best (filter only)")
    args = parser.parse_args()
    print("| nodes | NodeNames sent | filterResult | filter p50 | filter p99 | prioritize p50 | "
          "prioritize p99 | "
          "filter+prioritize p50 | filter+prioritize p99 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for count, mode, fr in itertools.product(args.nodes, args.modes, args.filter_result):
        r = asyncio.run(run(count, args.requests, args.seed, mode, fr))
        print(f"| {count} | {r['names']:.0f} ({mode}) | {fr} | {r['filter_p50_ms']:.2f} ms | "
              f"{r['filter_p99_ms']:.2f} ms | "
              f"{r['prioritize_p50_ms']:.2f} ms | {r['prioritize_p99_ms']:.2f} ms | "
              f"{r['both_p50_ms']:.2f} ms | {r['both_p99_ms']:.2f} ms |", flush=True)


if __name__ == "__main__":
    main()
