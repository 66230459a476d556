"""Usage samples reaching the engine (issue 28): 20 rounds of 25 usage-only node updates (what
agents write every period) and one `scored` over 15,000 nodes of 8 cards.

    PYTHONPATH=src .venv/bin/python bench/usage_upsert.py this

Compare with another tree side by side in one session (PYTHONPATH=<its src>): on main before
the in-place path each round rebuilt the whole layout (docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
import sys
import time

from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.placement import Engine
from elastic_gpu.core.request import ContainerRequest, PodRequest
from elastic_gpu.core.usage import CardUsage

NODES, CARDS, ROUNDS, PER_ROUND = 15_000, 8, 20, 25


def main(label: str) -> None:
    nodes = [Node(f"n{i}", 64_000, 1 << 19,
                  tuple(Card(c, f"G-{i}-{c}", "A100", 81_920) for c in range(CARDS)))
             for i in range(NODES)]
    engine = Engine(nodes, seed=1)
    pod = PodRequest("p", containers=(ContainerRequest.share("m", 300, 4096),),
                     cpu_milli=1000, memory_mib=1024)
    names = engine.nodes()
    engine.filter(pod, names)
    started = time.perf_counter()
    for k in range(ROUNDS):
        for j in range(PER_ROUND):
            node = nodes[(k * PER_ROUND + j) % NODES]
            sample = CardUsage(1024 * (k + 1), 0, k)
            engine.upsert_node(dataclasses.replace(node, cards=tuple(
                dataclasses.replace(c, usage=sample) for c in node.cards)))
        engine.scored(pod, names)
    print(f"{label}: {ROUNDS} x ({PER_ROUND} usage samples + one scored over {NODES} nodes): "
          f"{time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "this")
