"""Where the extender's start goes (issue 29): its two processes under cProfile at N nodes.

Loads a cluster as `sched_ready.py` does (`egpu_testing.bulkload`: N nodes x 8 cards, 8
bound pods a node), then profiles (1) the API worker's `Worker` in this process until every
feed's list has been sent (each page encoded for the pipe, then dropped) and (2) `egpu
scheduler` under `python -m cProfile` from launch to `/readyz` 200. Prints the top functions
of each. cProfile roughly doubles Python's time: read the shares, not the seconds.

    .venv/bin/python bench/sched_ready_profile.py --nodes 1000
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

from sched_ready import load_population

from egpu_testing.bulkload import DEFAULT_CONCURRENCY
from egpu_testing.cluster import TestCluster
from egpu_testing.workbench import ExtenderProcess
from elastic_gpu.devcluster.ports import free_ports
from elastic_gpu.kube.transport import RestClient
from elastic_gpu.scheduler import ipc
from elastic_gpu.scheduler.apiworker import FEEDS, Worker


async def worker_lists(kubeconfig: Path) -> float:
    """Seconds until the worker has sent the last page of every feed."""
    client = RestClient.from_config(kubeconfig)
    done: set[str] = set()
    every_list = asyncio.Event()

    def send(message: ipc.WorkerMessage) -> None:
        ipc.encode(message)
        if isinstance(message, ipc.Page) and message.last:
            done.add(message.feed)
            if len(done) == len(FEEDS):
                every_list.set()

    worker = Worker(client, send)
    started = time.perf_counter()
    worker.start()
    await every_list.wait()
    took = time.perf_counter() - started
    for task in worker.tasks.values():
        task.cancel()
    await asyncio.gather(*worker.tasks.values(), return_exceptions=True)
    await client.close()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="egpu-ready-profile-") as tmp:
        work = Path(tmp)
        plane = TestCluster(work_dir=work / "k8s", die_with_parent=True)
        plane.start(scheduler=False, kwok_enabled=False, controller_manager=False)
        try:
            load_population(plane.kubeconfig, args.nodes, 1, DEFAULT_CONCURRENCY)
            profile = cProfile.Profile()
            profile.enable()
            took = asyncio.run(worker_lists(plane.kubeconfig))
            profile.disable()
            print(f"API worker: every list sent in {took:.1f} s (profiled)")
            pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)
            (port,) = free_ports(1)
            output = work / "scheduler.prof"
            extender = ExtenderProcess(plane.kubeconfig, port, work / "extender.log",
                                       python_args=("-m", "cProfile", "-o", str(output)))
            started = time.monotonic()
            extender.start(timeout_s=900)
            print(f"egpu scheduler: ready in {time.monotonic() - started:.1f} s (profiled)")
            extender.stop()  # SIGINT: it exits cleanly and cProfile writes its file
            pstats.Stats(str(output)).sort_stats("tottime").print_stats(args.top)
        finally:
            plane.stop()


if __name__ == "__main__":
    main()
