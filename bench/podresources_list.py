"""What reading the kubelet's PodResources API costs the agent per usage sample: one `List` over
a unix socket plus reading its device IDs as cards (`agent.podresources`), on a full node.

    .venv/bin/python bench/podresources_list.py [--pods 110] [--calls 200]

The kubelet side is `egpu_testing.podresources.PodResourcesDouble` (a real gRPC server on a
real unix socket): `--pods` pods of one container each, every one holding a 5 % share (5
`elasticgpu.io/gpu-core` device IDs) of one of 8 cards, and a whole card for every eighth pod.
Prints the median and p99 of one call, in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from egpu_testing.podresources import PodResourcesDouble
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.devices import build_plans, logical_cards
from elastic_gpu.agent.podresources import kubelet_cards, list_devices

CARDS = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=110)  # kubelet's default maxPods
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    cards = logical_cards(FakeBackend.from_dict(
        {"cards": [{"model": "A100-SXM4-80GB", "memoryMiB": 81920}] * CARDS}, "n1").discover(),
        False)
    plans = build_plans(cards, parse_config({}))
    with tempfile.TemporaryDirectory(prefix="podres", dir="/tmp") as root:
        kubelet = PodResourcesDouble(Path(root) / "kubelet.sock")
        allocations: dict[tuple[str, str, str], dict[str, list[str]]] = {}
        for i in range(args.pods):
            card = i % CARDS
            devices = {"elasticgpu.io/gpu-core": [f"{card}-{(i // CARDS) * 5 + k}"
                                                  for k in range(5)]}
            if i % 8 == 0:
                devices["nvidia.com/gpu"] = [cards[card].card.uuid]
            allocations[("bench", f"pod-{i}", "main")] = devices
        kubelet.allocations = allocations
        kubelet.start()
        try:
            times = []
            for _ in range(args.calls):
                started = time.perf_counter()
                held = kubelet_cards(list_devices(kubelet.socket), plans)
                times.append((time.perf_counter() - started) * 1000)
            assert sum(len(refs) for refs in held.values()) >= args.pods
        finally:
            kubelet.stop()
    times.sort()
    print(f"pods={args.pods} calls={args.calls}: List + cards median "
          f"{statistics.median(times):.2f} ms, p99 {times[int(len(times) * 0.99) - 1]:.2f} ms")


if __name__ == "__main__":
    main()
