"""The defragmentation planner for a pending MIG pod on a large cluster, in process (issue 30):
what one `plan_moves` call costs.

    .venv/bin/python bench/defrag_mig_plan.py [--nodes 100,500,1000] [--runs 5]

Each node has eight A100-80GB cards carved into two 3g.40gb instances; every instance but one
per node is held by a movable one-instance pod, so the cluster has one free instance per node
and a pod asking two 3g.40gb on one node is Pending. The plan: one holder moved to another
node's free instance. Times `core.defrag.plan_moves` (candidates and the engine trials) and
prints medians as a Markdown table; checks each call found the one-move plan.
"""

from __future__ import annotations

import argparse
import statistics
import time

from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.defrag import plan_moves
from elastic_gpu.core.model import Card, MigInstance, Node
from elastic_gpu.core.placement import Engine, PolicyConfig
from elastic_gpu.core.request import ContainerRequest, PodRequest, RequestKind
from elastic_gpu.core.resources import MigProfile

CARDS = 8
P3 = MigProfile.parse("3g.40gb")


def mig_pod(name: str, count: int) -> PodRequest:
    return PodRequest(name, containers=(ContainerRequest("main", RequestKind.MIG, count, 0, 0,
                                                         P3),), cpu_milli=1000, memory_mib=1024)


def cluster(nodes: int) -> tuple[Engine, dict[str, PodRequest]]:
    inventory = [Node(f"n{i}", 128_000, 1 << 20, tuple(
        Card(c, f"GPU-n{i}-{c}", "A100-SXM4-80GB", 81920,
             mig=(MigInstance(P3, f"MIG-n{i}-{c}-0", 0), MigInstance(P3, f"MIG-n{i}-{c}-1", 4)))
        for c in range(CARDS))) for i in range(nodes)]
    engine = Engine(inventory, PolicyConfig(check_host_resources=False), seed=1)
    movable: dict[str, PodRequest] = {}
    for node in inventory:
        for card in node.cards:
            for inst in card.mig:
                if card.index == CARDS - 1 and inst.uuid.endswith("-1"):
                    continue  # the node's one free instance
                pod = mig_pod(f"{inst.uuid}-pod", 1)
                share = CardShare(card.index, card.uuid, 0, 40960, P3.name, inst.uuid)
                engine.allocate(pod.key, Assignment(node.name, {"main": (share,)}), pod)
                movable[pod.key] = pod
    return engine, movable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="100,500,1000")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print("| nodes | MIG instances | plan_moves median (ms) | max (ms) |")
    print("|---|---|---|---|")
    for n in (int(x) for x in args.nodes.split(",")):
        engine, movable = cluster(n)
        pending = mig_pod("pair", 2)
        times = []
        for _ in range(args.runs):
            started = time.perf_counter()
            plan = plan_moves(engine, pending.key, pending, movable, 2)
            times.append(time.perf_counter() - started)
            assert plan is not None and len(plan.moves) == 1, plan
        print(f"| {n} | {n * CARDS * 2} | {1000 * statistics.median(times):.0f} | "
              f"{1000 * max(times):.0f} |")


if __name__ == "__main__":
    main()
