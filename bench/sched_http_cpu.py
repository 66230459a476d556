"""What the extender's HTTP edge costs its process per request, on a kept-alive connection
and on a new connection per request (as kube-scheduler's extender client mostly does with binds
in flight: its transport keeps Go's default two idle connections a host).

The extender's aiohttp app behind its connection gate (`egpu_testing.workbench.ServedExtender`)
on uvloop, as `egpu scheduler` serves it, on 1,000 empty nodes x 8 cards; the client is this
process's other thread. The figure is the server thread's own CPU time
(`time.pthread_getcpuclockid`), so the client's work does not enter it.

    .venv/bin/python bench/sched_http_cpu.py [--requests 2000] [--tls [--key-type rsa]]

`--tls`: HTTPS with client certificates, the server's context as `egpu scheduler --tls-cert
--tls-key --tls-client-ca` builds it (`scheduler.app.tls_context`; `TestPki`'s P-256 keys), as
the chart deploys the extender: a new connection is then a TLS handshake. `--key-type rsa`:
2,048-bit RSA keys, what helm's `genCA`/`genSignedCert` make for the chart.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from http.client import HTTPConnection, HTTPSConnection
from pathlib import Path

import uvloop

from egpu_testing.workbench import ServedExtender, TestPki, pod_manifest, ready_state
from elastic_gpu.core.model import Card, Node
from elastic_gpu.scheduler.app import ServeOptions, tls_context
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.state import SchedulerState

#: the nodes kube-scheduler sends of 1,000 (its adaptive percentageOfNodesToScore: 42 %)
ASKED = 420


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tls", action="store_true",
                        help="HTTPS with client certificates, as the chart deploys it")
    parser.add_argument("--key-type", choices=("ec", "rsa"), default="ec",
                        help="--tls keys: ECDSA P-256, or RSA 2048 (helm's, the chart's)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="egpu-http-cpu-") as tmp:
        run(args, TestPki.create(Path(tmp), args.key_type) if args.tls else None)


def run(args: argparse.Namespace, pki: TestPki | None) -> None:
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # as runtime.eventloop does
    nodes = [Node(f"n{i}", 64_000, 256_000,
                  tuple(Card(c, f"GPU-{i}-{c}", "A100", 40960) for c in range(8)))
             for i in range(1000)]
    server_tls = None if pki is None else tls_context(ServeOptions(
        tls_cert=pki.server_cert, tls_key=pki.server_key, tls_client_ca=pki.ca))
    served = ServedExtender(Extender(ready_state(nodes, SchedulerState(SchedulerConfig()))),
                            tls=server_tls)
    clock = time.pthread_getcpuclockid(served.thread.ident or 0)

    def connect() -> HTTPConnection:
        if pki is None:
            return HTTPConnection("127.0.0.1", served.port, timeout=30)
        return HTTPSConnection("127.0.0.1", served.port, timeout=30,
                               context=pki.client_context())

    kept = connect()
    names = [f"n{i}" for i in range(0, 1000, 2)][:ASKED]

    def exchange(conn: HTTPConnection | None, method: str, path: str, body: bytes | None) -> None:
        fresh = conn is None
        conn = conn or connect()
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
    print(f"{args.requests} requests a round, {args.rounds} rounds"
          f"{f', HTTPS with client certificates ({args.key_type} keys)' if pki else ''}; "
          "the server thread's CPU "
          "per request (median, rounds)")
    print("| request | CPU us per request | rounds |")
    print("|---|---|---|")
    for key, values in rows.items():
        runs = ", ".join(f"{v * 1e6:.0f}" for v in values)
        print(f"| {key} | {statistics.median(values) * 1e6:.0f} | {runs} |")


if __name__ == "__main__":
    main()
