"""What checking resource names and counting replicas costs the engine: the extender's hot
calls (a layout rebuild, then filter as the extender runs it: scored over every node plus 16
explanations; place + allocate) on N nodes x 8 cards, with
cards that say nothing (the simulator, offers unknown), NVIDIA cards that say what they offer,
and the same beside 10% time-sliced IX nodes with IX pods. Medians of --repeat runs.

    .venv/bin/python bench/engine_offers.py --nodes 1000 --pods 2000 --repeat 5
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.placement import Engine, PolicyConfig, Unschedulable
from elastic_gpu.core.request import PodRequest, container_request

NV = {"nvidia.com/gpu": 1, "elasticgpu.io/gpu-core": 100, "elasticgpu.io/gpu-memory": 81920}
IX = {"iluvatar.com/gpu": 4, "elasticgpu.io/gpu-core": 100, "elasticgpu.io/gpu-memory": 32768}


def cluster(nodes: int, kind: str) -> list[Node]:
    out = []
    for n in range(nodes):
        ix = kind == "mixed" and n % 10 == 0
        offers = None if kind == "unknown" else (IX if ix else NV)
        cards = tuple(Card(i, f"GPU-{n}-{i}", "BI-V100" if ix else "A100", 81920, offers=offers)
                      for i in range(8))
        out.append(Node(f"node-{n:04d}", 96000, 1 << 20, cards))
    return out


def pods(count: int, kind: str) -> list[PodRequest]:
    shapes = [{"elasticgpu.io/gpu-core": "30", "elasticgpu.io/gpu-memory": "8192"},
              {"nvidia.com/gpu": "1"}, {"tencent.com/vcuda-core": "50"}, {"nvidia.com/gpu": "2"}]
    if kind == "mixed":
        shapes.append({"iluvatar.com/gpu": "1"})
    return [PodRequest(f"p{i}", containers=(container_request(
        "main", {"limits": shapes[i % len(shapes)]}),), cpu_milli=100) for i in range(count)]


def run(nodes: int, count: int, kind: str) -> dict[str, float]:
    inventory = cluster(nodes, kind)
    workload = pods(count, kind)
    names = [n.name for n in inventory]
    start = time.perf_counter()
    engine = Engine(inventory, PolicyConfig(check_host_resources=False))
    engine.filter(workload[0], names[:1])  # the layout rebuild
    rebuild = time.perf_counter() - start
    start = time.perf_counter()
    for pod in workload[:200]:
        # what the extender's filter does: vectorised fit + scores over every node, and
        # explanations for the first 16 failed ones (scheduler.state.placement.DETAIL_LIMIT)
        scored = engine.scored(pod, names)
        engine.filter(pod, scored.failed[:16])
    filter_ms = (time.perf_counter() - start) / 200 * 1000
    start = time.perf_counter()
    placed = 0
    for pod in workload:
        try:
            engine.allocate(pod.key, engine.place(pod))
            placed += 1
        except Unschedulable:
            pass  # a full cluster turns pods away: the bench times the calls, not the fit
    place_ms = (time.perf_counter() - start) / len(workload) * 1000
    return {"rebuild_ms": rebuild * 1000, "filter_scored_ms": filter_ms, "place_ms": place_ms,
            "placed": placed}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{args.nodes} nodes x 8 cards, {args.pods} pods, median of {args.repeat}; "
          f"{platform.python_implementation()} {platform.python_version()}")
    print("| cards | layout rebuild ms | extender filter over all nodes, ms/pod | "
          "place + allocate, ms/pod | placed |")
    print("|---|---|---|---|---|")
    for kind in ("unknown", "nvidia", "mixed"):
        runs = [run(args.nodes, args.pods, kind) for _ in range(args.repeat)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"| {kind} | {med['rebuild_ms']:.1f} | {med['filter_scored_ms']:.2f} | "
              f"{med['place_ms']:.2f} | {int(med['placed'])} |")


if __name__ == "__main__":
    main()
