"""What the extender's HTTP edge costs its process per request, on a kept-alive connection
and on a new connection per request (as kube-scheduler's extender client mostly does with binds
in flight: its transport keeps Go's default two idle connections a host).

The extender's aiohttp app behind its connection gate (`egpu_testing.workbench.ServedExtender`)
on uvloop, as `egpu scheduler` serves it, on 1,000 empty nodes x 8 cards; the client is this
process's other thread. The figure is the server thread's own CPU time
(`time.pthread_getcpuclockid`), so the client's work does not enter it.

    .venv/bin/python bench/sched_http_cpu.py [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable
from http.client import HTTPConnection

import uvloop

from egpu_testing.workbench import ServedExtender, pod_manifest, ready_state
from elastic_gpu.core.model import Card, Node
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.state import SchedulerState

#: the nodes kube-scheduler sends of 1,000 (its adaptive percentageOfNodesToScore: 42 %)
ASKED = 420


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # as runtime.eventloop does
    nodes = [Node(f"n{i}", 64_000, 256_000,
                  tuple(Card(c, f"GPU-{i}-{c}", "A100", 40960) for c in range(8)))
             for i in range(1000)]
    served = ServedExtender(Extender(ready_state(nodes, SchedulerState(SchedulerConfig()))))
    clock = time.pthread_getcpuclockid(served.thread.ident or 0)
    kept = HTTPConnection("127.0.0.1", served.port, timeout=30)
    names = [f"n{i}" for i in range(0, 1000, 2)][:ASKED]

    def exchange(conn: HTTPConnection | None, method: str, path: str, body: bytes | None) -> None:
        fresh = conn is None
        conn = conn or HTTPConnection("127.0.0.1", served.port, timeout=30)
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"{method} {path}: HTTP {response.status}")
        if fresh:
            conn.close()

    def healthz(conn: HTTPConnection | None, _: int) -> None:
        exchange(conn, "GET", "/healthz", None)

    def filter_(conn: HTTPConnection | None, i: int) -> None:
        pod = pod_manifest(f"p{i}", uid=f"u{i}", limits={"nvidia.com/gpu": "1"})
        pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = f"{10 + i}m"  # distinct
        exchange(conn, "POST", "/filter",
                 json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode())

    def per_request(call: Callable[[HTTPConnection | None, int], None], keep: bool,
                    offset: int) -> float:
        start = time.clock_gettime(clock)
        for i in range(args.requests):
            call(kept if keep else None, offset + i)
        return (time.clock_gettime(clock) - start) / args.requests

    rows: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for label, call in (("healthz", healthz), ("filter", filter_)):
            for keep in (True, False):
                key = f"{label}, {'kept-alive connection' if keep else 'new connection each'}"
                rows.setdefault(key, []).append(
                    per_request(call, keep, (r * 4 + len(rows)) * args.requests))
    served.stop()
    print(f"{args.requests} requests a round, {args.rounds} rounds; the server thread's CPU "
          "per request (median, rounds)")
    print("| request | CPU us per request | rounds |")
    print("|---|---|---|")
    for key, values in rows.items():
        runs = ", ".join(f"{v * 1e6:.0f}" for v in values)
        print(f"| {key} | {statistics.median(values) * 1e6:.0f} | {runs} |")


if __name__ == "__main__":
    main()
