"""What a scrape of the extender's /metrics costs at cluster scale, and what it does to the
verbs meanwhile: 1,000 / 5,000 nodes x 8 cards, eight bound pods a node (`sched_scale`'s
population: 8 shares a node, so five series per card and two per share).

    .venv/bin/python bench/metrics_scrape.py --nodes 1000 5000 [--before-src DIR/src]

Per size, in a fresh subprocess (per checkout with `--before-src`: the same measurement run on
another checkout's src/, side by side):
- **page**: CPU (`time.process_time`) to write the whole page in process (on uvloop, as the
  extender does, pauses included), median of 5, and its size;
- **health during a scrape**: the page fetched over HTTP on loopback from a served extender
  while another connection sends `/healthz` one after another (both from a process of their
  own): the longest and the median wait of a health check during the scrape (median over 3
  scrapes). A page written on the event loop in one go holds every request that long.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from http.client import HTTPConnection
from typing import Any

import uvloop
from sched_scale import inventory, population

from egpu_testing.workbench import ServedExtender, feed_nodes
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.state import SchedulerState


def page_of(extender: Any) -> Any:
    """The page writer of the checkout measured: `Metrics.page` since it exists, before it
    the registry through prometheus_client."""
    metrics = extender.metrics
    if hasattr(metrics, "page"):
        loop = uvloop.new_event_loop()  # the extender's loop, made once (asyncio.run's setup
        # and the standard loop's pauses added ~30 ms a page at 1,000 nodes)
        return lambda: loop.run_until_complete(metrics.page(""))[0]
    from elastic_gpu.runtime.metrics import exposition
    return lambda: exposition(metrics.registry, "")[0]


def health_during_scrape(port: int) -> tuple[float, float]:
    """(longest, median) health-check wait in ms while one scrape is served (in a process of
    its own: clients in the server's process would wait for its GIL, not for its loop)."""
    done = threading.Event()

    def scrape() -> None:
        conn = HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("GET", "/metrics")
        conn.getresponse().read()
        done.set()

    waits: list[float] = []
    conn = HTTPConnection("127.0.0.1", port, timeout=120)
    thread = threading.Thread(target=scrape)
    thread.start()
    while not done.is_set():
        t0 = time.perf_counter()
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        waits.append(time.perf_counter() - t0)
    thread.join()
    return max(waits) * 1e3, statistics.median(waits) * 1e3


def one_size(count: int) -> dict[str, Any]:
    nodes = inventory(count)
    pods = population(nodes, random.Random(1))
    state = SchedulerState(SchedulerConfig())
    feed_nodes(state, nodes)
    state.replace_pods(pods)
    for source in sorted(state.required_sources):
        state.mark_synced(source)
    extender = Extender(state)
    write = page_of(extender)
    cpu: list[float] = []
    size = 0
    for _ in range(5):
        t0 = time.process_time()
        size = len(write())
        cpu.append(time.process_time() - t0)
    srv = ServedExtender(extender)
    try:
        with multiprocessing.get_context("spawn").Pool(1) as clients:
            stalls = [clients.apply(health_during_scrape, (srv.port,)) for _ in range(3)]
    finally:
        srv.stop()
    return {"nodes": count, "series_mb": size / 1e6, "page_cpu_ms": statistics.median(cpu) * 1e3,
            "health_max_ms": statistics.median(s[0] for s in stalls),
            "health_p50_ms": statistics.median(s[1] for s in stalls)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--before-src", default=None,
                        help="src/ of an earlier checkout, measured the same way beside this one")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a size, in this process
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one_size(args.one)))
        return
    checkouts = [("this checkout", None)]
    if args.before_src:
        checkouts.insert(0, (f"before ({args.before_src})", args.before_src))
    print("| code | nodes | page | page CPU (median of 5) | health check during a scrape: "
          "longest / median (median of 3 scrapes) |")
    print("|---|---|---|---|---|")
    for count in args.nodes:
        for label, src in checkouts:
            env = dict(os.environ)
            if src is not None:
                env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
            done = subprocess.run([sys.executable, __file__, "--one", str(count)], env=env,
                                  check=True, capture_output=True, text=True)
            r = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"| {label} | {count} | {r['series_mb']:.1f} MB | {r['page_cpu_ms']:.0f} ms | "
                  f"{r['health_max_ms']:.0f} / {r['health_p50_ms']:.2f} ms |", flush=True)


if __name__ == "__main__":
    main()
