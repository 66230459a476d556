"""Time from a kubelet restart (every socket deleted, kubelet.sock served anew) until every
device plugin of the agent is registered again and streaming its devices.

    .venv/bin/python bench/agent_reregister.py [--restarts 20]

The kubelet side is `agent.testing.KubeletDouble` over real unix sockets; the agent serves
two plugins (nvidia.com/gpu and elasticgpu.io/gpu-core) for 8 fake cards.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from egpu_testing.kubelet import KubeletDouble
from elastic_gpu.agent.backends.fake import FakeBackend
from elastic_gpu.agent.config import parse_config
from elastic_gpu.agent.runtime import Agent

RESOURCES = ("nvidia.com/gpu", "elasticgpu.io/gpu-core")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--restarts", type=int, default=20)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the agent logs every restart it notices
    plugin_dir = Path(tempfile.mkdtemp(prefix="egpu-rr-"))
    kubelet = KubeletDouble(plugin_dir)
    kubelet.start()
    inventory = {"cards": [{"model": "A100", "memoryMiB": 40960} for _ in range(8)]}
    agent = Agent(parse_config({"healthCheck": {"enabled": False}}),
                  FakeBackend.from_dict(inventory, "n"), "n", plugin_dir=plugin_dir)
    agent.start()
    samples = []
    try:
        kubelet.wait_for(lambda: len(kubelet.registrations) == len(RESOURCES))
        for _ in range(args.restarts):
            before = len(kubelet.registrations)
            start = time.monotonic()
            kubelet.restart()
            if not kubelet.wait_for(lambda before=before: len(kubelet.registrations) ==
                                    before + len(RESOURCES) and
                                    all(kubelet.devices(r) for r in RESOURCES), 5):
                raise SystemExit("not re-registered within 5 s")
            samples.append(time.monotonic() - start)
    finally:
        agent.stop()
        kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)
    print(f"re-registration after a kubelet restart, {len(samples)} restarts: "
          f"median {statistics.median(samples) * 1000:.0f} ms, max {max(samples) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
