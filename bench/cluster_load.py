"""Loading a new cluster with N fake nodes and their pods: devcluster's threads against the bulk loader.

Each round starts a fresh control plane (etcd, kube-apiserver, nothing else) per loader and
fills it with `sched_scale.inventory(N)` (8 cards a node) and `sched_scale.population`'s 8
bound pods a node: "threads" registers the nodes with `register_fake_nodes(new=True)` and
creates the pods through the project's blocking client, `--parallelism` at a time (what
`sched_ready.py` did before); "bulk" sends the same requests with `egpu_testing.bulkload`.
Wall seconds depend on how busy the box is; the CPU seconds of the loader, kube-apiserver and
etcd per node say what loading costs (read from /proc, children excluded).

    .venv/bin/python bench/cluster_load.py --nodes 1000 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sched_scale import inventory, population

from egpu_testing.bulkload import DEFAULT_CONCURRENCY, load_cluster
from egpu_testing.cluster import TestCluster
from elastic_gpu.devcluster.nodes import register_fake_nodes
from elastic_gpu.kube.resources import PODS
from elastic_gpu.kube.sync import SyncKubeClient


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (its children excluded)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_with_threads(kube: SyncKubeClient, count: int, seed: int, parallelism: int) -> None:
    nodes = inventory(count)
    register_fake_nodes(kube, nodes, parallelism=parallelism, new=True)

    def create(pod: dict[str, Any]) -> None:
        pod["metadata"].pop("uid", None)
        pod["metadata"].pop("resourceVersion", None)
        kube.create(PODS.path(pod["metadata"]["namespace"]), pod)

    with ThreadPoolExecutor(max_workers=parallelism) as pool:
        list(pool.map(create, population(nodes, random.Random(seed)), chunksize=64))


def load_in_bulk(kubeconfig: Path, count: int, seed: int, concurrency: int) -> None:
    nodes = inventory(count)
    load_cluster(kubeconfig, nodes, population(nodes, random.Random(seed)),
                 concurrency=concurrency)


def one_load(loader: str, count: int, args: argparse.Namespace, work: Path) -> str:
    plane = TestCluster(work_dir=work, die_with_parent=True)
    plane.start(scheduler=False, kwok_enabled=False, controller_manager=False)
    try:
        pids = {name: process.pid for name, process in plane.processes.items()}
        before = {name: cpu_s(pid) for name, pid in pids.items()}
        load_before = os.getloadavg()[0]
        mine, started = time.process_time(), time.monotonic()
        if loader == "threads":
            load_with_threads(plane.kube(), count, args.seed, args.parallelism)
        else:
            load_in_bulk(plane.kubeconfig, count, args.seed, args.concurrency)
        wall = time.monotonic() - started
        mine = time.process_time() - mine
        spent = {name: cpu_s(pid) - before[name] for name, pid in pids.items()}
        per_node = (mine + sum(spent.values())) / count * 1000
        return (f"| {count:,} | {loader} | {wall:.0f} s | {mine:.1f} s | "
                f"{spent['kube-apiserver']:.1f} s | {spent['etcd']:.1f} s | {per_node:.0f} ms | "
                f"{load_before:.1f} / {os.getloadavg()[0]:.1f} |")
    finally:
        plane.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--parallelism", type=int, default=16,
                        help="threads of the devcluster loader (sched_ready's old default)")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY,
                        help="requests in flight of the bulk loader")
    parser.add_argument("--loaders", default="threads,bulk")
    args = parser.parse_args()
    print("| nodes | loader | wall (nodes + 8 pods a node) | CPU, loader | CPU, kube-apiserver "
          "| CPU, etcd | CPU per node, all three | load before / after |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory(prefix="egpu-cluster-load-") as tmp:
        for round_no in range(args.rounds):
            for loader in args.loaders.split(","):
                work = Path(tmp) / f"{loader}-{round_no}"
                print(one_load(loader, args.nodes, args, work), flush=True)


if __name__ == "__main__":
    main()
