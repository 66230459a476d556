"""The extender at cluster scale (issue 29): 1,000 / 5,000 / 15,000 nodes x 8 cards, ~8 pods a node.

Each size runs in a fresh subprocess, so that its peak memory is its own:
- **build**: the extender's state from the lists its API worker hands over at start (nodes,
  GPUDevices, bound pods with their assignments), until the first filter is answered: seconds,
  and the process's peak RSS (the state, the engine, the Python runtime and this script's
  inputs); then what a full garbage collection costs (the pause the next one will be), with
  the extender's policy (`runtime.gcpolicy`) where the code measured has it;
- **latency** over HTTP on loopback, one request at a time as kube-scheduler sends them, with
  kube-scheduler's default node sample (`sched_latency.sample_size`): filter + prioritize
  (`filterResult: all`) and filter alone (`best`), for pods of six shapes ("identical": the
  same few shapes again and again, as a Deployment's replicas) and for pods that each ask
  their own CPU ("distinct": every pod a new shape for the engine's score cache); after each
  answer the pod is reserved on the chosen node, as its bind would.

    .venv/bin/python bench/sched_scale.py --nodes 1000 5000 15000 --requests 400

The population per node: six shares of 10-60% and 1-16 GiB on cards 0-5, a whole-card pod on
card 6 (card 7 free) and one CPU-only pod; node CPU and memory partly held by them.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import aiohttp
import msgspec
from aiohttp import web
from sched_latency import SHAPES, pct, sample_size

from egpu_testing.workbench import feed_nodes, pod_manifest
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.request import pod_request_from_manifest
from elastic_gpu.scheduler.binder import with_binding
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.state import SchedulerState

CARD_MIB = 81920


def inventory(count: int) -> list[Node]:
    return [Node(f"node-{i:05d}", 96_000, 786_432,
                 tuple(Card(c, f"GPU-{i}-{c}", "A100-SXM4-80GB", CARD_MIB) for c in range(8)))
            for i in range(count)]


def population(nodes: list[Node], rng: random.Random) -> list[dict[str, Any]]:
    """Bound pods as the API holds them: eight per node (see the module's docstring)."""
    pods: list[dict[str, Any]] = []
    for node in nodes:
        for c in range(8):
            name = f"bg-{node.name}-{c}"
            if c < 6:
                percent = rng.randrange(10, 61, 10)
                memory = rng.randrange(1, 17) * 1024
                limits = {"elasticgpu.io/gpu-core": str(percent),
                          "elasticgpu.io/gpu-memory": str(memory)}
                share = CardShare(c, node.cards[c].uuid, percent * 10, memory)
            elif c == 6:
                limits = {"nvidia.com/gpu": "1"}
                share = CardShare(c, node.cards[c].uuid, 1000, CARD_MIB)
            else:
                limits = {}
                share = None
            pod = pod_manifest(name, uid=name, limits=limits)
            container = pod["spec"]["containers"][0]["resources"]["requests"]
            container.update({"cpu": f"{rng.randrange(1, 9)}", "memory": f"{rng.randrange(4, 64)}Gi"})
            pod["metadata"]["resourceVersion"] = "1"
            if share is None:
                pod["spec"]["nodeName"] = node.name
                pods.append(pod)
            else:
                pods.append(with_binding(pod, node.name, Assignment(node.name, {"main": (share,)})))
    return pods


def request_pod(name: str, i: int, rng: random.Random, distinct: bool) -> dict[str, Any]:
    """The i-th pod asked about: one of six shapes; `distinct`: with a CPU request of its own."""
    percent, memory = rng.choice(SHAPES)
    limits = {"elasticgpu.io/gpu-core": str(percent)}
    if memory:
        limits["elasticgpu.io/gpu-memory"] = str(memory)
    pod = pod_manifest(name, uid=name, limits=limits)
    pod["metadata"]["resourceVersion"] = str(i + 2)
    if distinct:
        pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = f"{100 + i}m"
    return pod


async def latency(state: SchedulerState, requests: int, seed: int, prioritize: bool,
                  distinct: bool) -> dict[str, float]:
    rng = random.Random(seed)
    encode, decode = msgspec.json.encode, msgspec.json.decode
    runner = web.AppRunner(Extender(state).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    names = state.node_names()
    window = sample_size(len(names))
    start = 0
    cycles: list[float] = []
    run = f"{'all' if prioritize else 'best'}-{'distinct' if distinct else 'identical'}"
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:
        for i in range(requests + 20):
            pod = request_pod(f"{run}-{i}", i, rng, distinct)
            asked = (names + names)[start:start + window]
            start = (start + window) % len(names)
            t0 = time.perf_counter()
            async with session.post("/filter", data=encode(
                    {"Pod": pod, "Nodes": None, "NodeNames": asked})) as resp:
                result = decode(await resp.read())
            if prioritize and result["NodeNames"]:
                async with session.post("/prioritize", data=encode(
                        {"Pod": pod, "Nodes": None, "NodeNames": result["NodeNames"]})) as resp:
                    scores = decode(await resp.read())
            else:
                scores = [{"Host": h, "Score": 10} for h in result["NodeNames"] or ()]
            t1 = time.perf_counter()
            if scores:
                best = max(scores, key=lambda h: h["Score"])["Host"]
                uid = pod["metadata"]["uid"]
                token, done = state.reserve(pod_request_from_manifest(pod), uid, best)
                state.settle(uid, token, "bound", with_binding(pod, best, done))
            if i >= 20:  # warm-up excluded
                cycles.append(t1 - t0)
    await runner.cleanup()
    return {"p50_ms": statistics.median(cycles) * 1e3, "p99_ms": pct(cycles, 0.99) * 1e3}


def freeze_survivors() -> bool:
    """The extender processes' garbage-collection policy, where the code measured has it."""
    try:
        from elastic_gpu.runtime import gcpolicy
    except ImportError:  # a checkout from before it (side-by-side runs)
        return False
    gcpolicy.freeze_survivors()
    return True


def full_collection_ms() -> float:
    """What the next full collection costs the process (whenever it comes: a quarter more
    long-lived objects since the last one)."""
    t0 = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - t0) * 1e3


def one_size(count: int, requests: int, seed: int) -> dict[str, Any]:
    frozen = freeze_survivors()
    rng = random.Random(seed)
    nodes = inventory(count)
    pods = population(nodes, rng)
    out: dict[str, Any] = {"nodes": count, "pods": len(pods)}
    for filter_result in ("all", "best"):
        config = SchedulerConfig(filterResult=filter_result)
        t0 = time.perf_counter()
        state = SchedulerState(config)
        feed_nodes(state, nodes)
        state.replace_pods(pods)
        for source in sorted(state.required_sources):
            state.mark_synced(source)
        state.filter(pod_request_from_manifest(request_pod("warm", 0, rng, False)), "warm",
                     state.node_names()[:1])
        if filter_result == "all":
            out["build_s"] = time.perf_counter() - t0
            out["build_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            out["gc_ms"] = full_collection_ms()
            out["gc_policy"] = frozen
        for distinct in (False, True):
            key = f"{filter_result}-{'distinct' if distinct else 'identical'}"
            out[key] = asyncio.run(latency(state, requests, seed, filter_result == "all",
                                           distinct))
        del state
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000, 15000])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a size, in this process
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one_size(args.one, args.requests, args.seed)))
        return
    print("| nodes | bound pods | build (s) | peak RSS after build | a full collection then | "
          "filter+prioritize p50 / p99, identical | same, distinct | filter (best) p50 / p99, "
          "identical | same, distinct | peak RSS |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for count in args.nodes:
        done = subprocess.run([sys.executable, __file__, "--one", str(count), "--requests",
                               str(args.requests), "--seed", str(args.seed)],
                              check=True, capture_output=True, text=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])

        def cell(key: str, r: dict[str, Any] = r) -> str:
            return f"{r[key]['p50_ms']:.2f} / {r[key]['p99_ms']:.2f} ms"

        policy = "" if r["gc_policy"] else " (no freezing)"
        print(f"| {count} | {r['pods']} | {r['build_s']:.1f} | {r['build_rss_mib']:.0f} MiB | "
              f"{r['gc_ms']:.0f} ms{policy} | "
              f"{cell('all-identical')} | {cell('all-distinct')} | {cell('best-identical')} | "
              f"{cell('best-distinct')} | {r['peak_rss_mib']:.0f} MiB |", flush=True)


if __name__ == "__main__":
    main()
