"""Cost of the extender's pod bookkeeping: `SchedulerState.observe_pod` for bound GPU pods.

Usage: python bench/sched_observe.py [--nodes 1000] [--pods 8000] [--repeat 5]
Every pod the API worker passes on (ADDED/MODIFIED) goes through `observe_pod`: its assignment
annotation is counted in the engine and its CPU and memory requests in the node's host usage.
The pods here are bound, one whole card each, with CPU and memory requests. To compare with
another checkout, run the same file with `PYTHONPATH=<other checkout>/src`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import elastic_gpu
from egpu_testing.workbench import pod_manifest, ready_state
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.model import Card, Node


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=8000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    nodes = [Node(f"n{i}", 64_000, 256_000,
                  tuple(Card(c, f"GPU-n{i}-{c}", "T4", 16384) for c in range(8)))
             for i in range(args.nodes)]
    pods = []
    for i in range(args.pods):
        node, card = f"n{i % args.nodes}", (i // args.nodes) % 8
        pod = pod_manifest(f"p{i}", uid=f"u{i}", containers={
            "main": {"nvidia.com/gpu": "1", "cpu": "2", "memory": "4Gi"}})
        assignment = Assignment(node, {"main": (CardShare(card, f"GPU-{node}-{card}", 1000, 0),)})
        pod["metadata"]["annotations"] = {ann.ASSIGNMENT: assignment.to_json()}
        pod["metadata"]["resourceVersion"] = str(i + 10)
        pod["spec"]["nodeName"] = node
        pods.append(pod)
    times = []
    for _ in range(args.repeat):
        state = ready_state(nodes)
        started = time.perf_counter()
        for pod in pods:
            state.observe_pod(pod)
        times.append(time.perf_counter() - started)
    median = statistics.median(times)
    print(f"{elastic_gpu.__file__}: {args.pods} bound pods observed in {median:.3f} s "
          f"(median of {args.repeat}), {median / args.pods * 1e6:.1f} us per pod")


if __name__ == "__main__":
    main()
