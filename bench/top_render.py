"""`egpu top` on a real control plane: one refresh by stage, and the command end to end.

Real etcd, kube-apiserver and kwok; `--nodes` fake GPU nodes of `--cards` cards each (their
GPUDevices published as the agent publishes them), `--pods` running GPU pods whose assignment
annotations hold shares of those cards, 10 claimed ElasticGPUs. Then:
- `--runs` refreshes as `egpu top` does one (four concurrent LISTs through kube.client, the
  pure view, the table rendered to text at 200 columns) after a warm-up: median and max of
  each stage;
- `egpu top --kubeconfig ...` and the kubectl plugin's `kubectl-egpu top` as fresh processes
  (`--runs` times each, output to a file): the wall time a user waits, Python's start and
  imports included.

    .venv/bin/python bench/top_render.py --nodes 100 --cards 8 --pods 400 --runs 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from egpu_testing.claims import install_crds
from egpu_testing.cluster import TestCluster
from egpu_testing.scenario import create_pods
from egpu_testing.topload import Refresh, claimed_elasticgpus, holder_pods, timed_refresh
from elastic_gpu.devcluster.nodes import fake_inventory, register_fake_nodes
from elastic_gpu.kube.client import KubeClient

NAMESPACE = "default"


async def refreshes(kubeconfig: Path, runs: int) -> list[Refresh]:
    client = KubeClient.from_config(kubeconfig)
    try:
        await timed_refresh(client)  # warm-up
        return [await timed_refresh(client) for _ in range(runs)]
    finally:
        await client.close()


def command_runs(argv: list[str], kubeconfig: Path, runs: int, out: Path) -> list[float]:
    walls = []
    env = {**os.environ, "COLUMNS": "200"}
    for _ in range(runs):
        started = time.perf_counter()
        with out.open("w") as sink:
            subprocess.run([*argv, "top", "--kubeconfig", str(kubeconfig)], stdout=sink,
                           check=True, env=env)
        walls.append(time.perf_counter() - started)
    return walls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--pods", type=int, default=400)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="egpu-top-bench-"))
    plane = TestCluster(work_dir=work / "k8s", die_with_parent=True)
    plane.start(scheduler=False, kwok_enabled=True)
    try:
        from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd

        ensure_crd(plane.kube())
        install_crds(plane)
        nodes = [fake_inventory(f"gpu-{i:03d}", gpus=args.cards) for i in range(args.nodes)]
        register_fake_nodes(plane.kube(), nodes)
        names = [n.name for n in nodes]
        deadline = time.monotonic() + 60
        while plane.kubectl("get", "serviceaccount", "default", check=False).returncode:
            assert time.monotonic() < deadline, "no default ServiceAccount"
            time.sleep(0.2)
        create_pods(plane.client(), holder_pods(NAMESPACE, names, args.pods, args.cards))
        plane.kubectl("create", "-f", "-", input=json.dumps(
            claimed_elasticgpus(NAMESPACE, names, min(10, args.nodes), card=args.cards - 1)))
        print(f"# {platform.node()}: {os.cpu_count()} cores, Python "
              f"{platform.python_version()}; {args.nodes} nodes x {args.cards} cards, "
              f"{args.pods} pods, 10 ElasticGPUs; {args.runs} runs", flush=True)
        done = asyncio.run(refreshes(plane.kubeconfig, args.runs))
        lines = len(done[-1].text.splitlines())
        print("| stage | median ms | max ms |\n|---|---|---|")
        for stage in ("fetch", "view", "render", "total"):
            ms = [getattr(r, stage) * 1000 for r in done]
            print(f"| {stage} | {statistics.median(ms):.0f} | {max(ms):.0f} |")
        commands = {"`egpu top`": [str(Path(sys.executable).with_name("egpu"))],
                    "`kubectl egpu top` (kubectl-egpu)": [sys.executable, "-m",
                                                          "elastic_gpu.cli.kubectl"]}
        for label, argv in commands.items():
            walls = [t * 1000 for t in command_runs(argv, plane.kubeconfig, args.runs,
                                                    work / "top.txt")]
            print(f"| {label} command, wall (process start included) | "
                  f"{statistics.median(walls):.0f} | {max(walls):.0f} |")
        print(f"# {lines} lines rendered; the command's output: {work / 'top.txt'}")
    finally:
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
