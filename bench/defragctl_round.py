"""The defragmentation controller's round on a large cluster, in process (issue 30): what one
round costs the leader when pods wait for capacity.

    .venv/bin/python bench/defragctl_round.py [--nodes 500] [--rounds 5]

`--nodes` eight-card A100-80GB nodes, every card holding one movable share (60 % on even
cards, 30 % on odd ones), so no whole card is free, and one move (a 30 % share onto another 30 %
card) frees one; 20 whole-card pods pending, each planned for.
The round (`DefragController.round`, report mode: no write waits on an API) reads the caches
into an Engine (`controller/defrag/cluster.py`) and plans for every pending pod. Times the read
alone and the whole round; prints medians as a Markdown table. The caches are
`egpu_testing.defrag`'s fixed informers: the API's cost is the integration tests'.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from egpu_testing.defrag import EvictionClient, StaticInformers, gpu_pod
from elastic_gpu.api import gpudevice
from elastic_gpu.controller.config import ControllerConfig, DefragConfig
from elastic_gpu.controller.defrag.cluster import read_cluster
from elastic_gpu.controller.defrag.controller import DefragController
from elastic_gpu.controller.manager import Context, Metrics
from elastic_gpu.controller.provisioning import ExtenderClient
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.model import Card
from elastic_gpu.kube.events import EventRecorder
from elastic_gpu.kube.resources import GPUDEVICES, NODES, PODS

CARDS = 8
MEMORY = 81920


def share(name: str, node: str, index: int, percent: int) -> dict[str, Any]:
    pod = gpu_pod(name, percent=percent, node=node)
    milli = percent * 10
    card = CardShare(index, f"GPU-{node}-{index}", milli, MEMORY * milli // 1000)
    pod["metadata"]["annotations"]["elasticgpu.io/assignment"] = Assignment(
        node, {"main": (card,)}).to_json()
    return pod


def build(nodes: int) -> DefragController:
    client = EvictionClient()
    informers = StaticInformers()
    recorder = EventRecorder(client, "bench")  # type: ignore[arg-type]
    recorder.record = lambda *_a: None  # type: ignore[method-assign]
    ctx = Context(client, informers, recorder, Metrics(),  # type: ignore[arg-type]
                  ExtenderClient("http://127.0.0.1:1"), "bench",
                  config=ControllerConfig(defrag=DefragConfig(enabled=True)))
    controller = DefragController(ctx)
    pods = informers.informer(PODS.path(), "").objects
    for n in range(nodes):
        name = f"n{n:05d}"
        informers.informer(NODES.path(), "").objects.append(
            {"metadata": {"name": name}, "status": {"allocatable": {"cpu": "128",
                                                                   "memory": "1Ti"}}})
        for i in range(CARDS):
            informers.informer(GPUDEVICES.path(), "").objects.append(gpudevice.card_to_object(
                name, Card(i, f"GPU-{name}-{i}", "A100-SXM4-80GB", MEMORY)))
            pods.append(share(f"s-{name}-{i}", name, i, 60 if i % 2 == 0 else 30))
    pods.extend(gpu_pod(f"whole-{k}", percent=None) for k in range(20))
    return controller


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    controller = build(args.nodes)
    reads, rounds = [], []
    for k in range(args.rounds):
        started = time.perf_counter()
        read_cluster(controller.devices.items(), controller.nodes.items(),
                     controller.pods.items(), [])
        reads.append(time.perf_counter() - started)
        started = time.perf_counter()
        asyncio.run(controller.round(1000.0 + k))
        rounds.append(time.perf_counter() - started)
    pods = len(controller.pods.items())
    plans = controller.ctx.metrics.registry.get_sample_value(
        "elasticgpu_defrag_plans_total", {"outcome": "reported"}) or 0
    print(f"| nodes | cards | pods | read (median s) | round, 20 pending (median s) | plans/round |"
          f"\n|---|---|---|---|---|---|\n"
          f"| {args.nodes} | {args.nodes * CARDS} | {pods} | {statistics.median(reads):.3f} | "
          f"{statistics.median(rounds):.3f} | {plans / args.rounds:g} |")


if __name__ == "__main__":
    main()
