"""The extender's HTTP edge: what validating a request costs, and whether one huge request
holds up the others.

1. Decoding and validating a filter body (a pod and N node names; N Node objects), median of
   many runs, with `wire` as it is on the path (`parse_args`, or the older `parse`).
2. While one huge request is in flight (the issue's 58 MiB / 4-million-name filter; a 16 MiB
   filter of whole Node objects; a 20,000-name filter), how long health checks and small
   filters on other connections take: median and max over the probes that overlapped it, per
   try, on a real aiohttp server.

    PYTHONPATH=src:tests python bench/sched_edge.py [--tries 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable
from http.client import HTTPConnection
from typing import Any

from egpu_testing.workbench import ServedExtender, pod_manifest, ready_state, send_raw
from elastic_gpu.core.model import Card, Node
from elastic_gpu.scheduler import wire
from elastic_gpu.scheduler.extender import Extender

POD = pod_manifest("probe", uid="uid-probe", limits={"elasticgpu.io/gpu-core": "30"})


def parser() -> Callable[[bytes], Any]:
    new = getattr(wire, "parse_args", None)
    if new is not None:
        return new  # type: ignore[no-any-return]
    return lambda body: wire.parse(wire.ExtenderArgs, body)  # type: ignore[attr-defined]


def node_object(i: int) -> dict[str, Any]:
    return {"metadata": {"name": f"n{i}", "labels": {f"label-{j}": "v" * 40 for j in range(20)}},
            "status": {"images": [{"names": [f"registry.example.com/image-{i}-{j}:tag"],
                                   "sizeBytes": 123456789} for j in range(40)]}}


def decode_costs() -> None:
    parse = parser()
    print("decode + validate a filter body (median of runs):")
    for label, body in (
            *((f"{n} names", json.dumps({"Pod": POD, "NodeNames": [f"node-{i:05d}" for i in
                                                                 range(n)]}).encode())
              for n in (500, 1_000, 5_000)),
            ("500 Node objects (~4 KiB each)", json.dumps(
                {"Pod": POD, "NodeNames": None,
                 "Nodes": {"items": [node_object(i) for i in range(500)]}}).encode())):
        runs = []
        for _ in range(200 if len(body) < 200_000 else 20):
            t0 = time.perf_counter()
            parse(body)
            runs.append(time.perf_counter() - t0)
        print(f"  {label:32s} {len(body) / 1024:8.0f} KiB  {statistics.median(runs) * 1e6:9.0f} us")


def _send(port: int, body: bytes) -> int:
    return send_raw(port, b"POST /filter HTTP/1.1\r\nHost: x\r\n", body)


def probe_during(srv: ServedExtender, body: bytes) -> tuple[int, float, dict[str, list[float]]]:
    done = threading.Event()
    latencies: dict[str, list[float]] = {"healthz": [], "filter": []}
    small = json.dumps({"Pod": POD, "NodeNames": ["n0", "n1", "n2"]}).encode()
    result: list[tuple[int, float]] = []

    started = threading.Event()

    def huge() -> None:
        started.set()
        t0 = time.perf_counter()
        status = _send(srv.port, body)
        result.append((status, time.perf_counter() - t0))
        done.set()

    def probe(kind: str) -> None:
        conn = HTTPConnection("127.0.0.1", srv.port, timeout=120)
        srv.get("/healthz", conn)  # connected and warm
        started.wait()
        while not done.is_set():
            overlapped = not done.is_set()  # started while the huge request was in flight
            t0 = time.perf_counter()
            if kind == "healthz":
                srv.get("/healthz", conn)
            else:
                srv.post("/filter", small, conn)
            if overlapped:
                latencies[kind].append(time.perf_counter() - t0)
            time.sleep(0.002)

    threads = [threading.Thread(target=probe, args=(k,)) for k in latencies]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    worker = threading.Thread(target=huge)
    worker.start()
    worker.join()
    for thread in threads:
        thread.join()
    return result[0][0], result[0][1], latencies


def stalls(tries: int) -> None:
    nodes = [Node(f"n{i}", 64_000, 256_000, tuple(Card(c, f"GPU-{i}-{c}", "A100", 16384)
                                                 for c in range(4))) for i in range(200)]
    srv = ServedExtender(Extender(ready_state(nodes)))
    pod = json.dumps(POD).encode()
    names = b'{"Pod": ' + pod + b', "NodeNames": [' + b",".join(
        b'"node-%07d"' % i for i in range(4_000_000)) + b"]}"
    items = []
    size = 0
    while size < 16 * 2**20 - 20_000:
        item = json.dumps(node_object(len(items)))
        items.append(item)
        size += len(item) + 1
    objects = (b'{"Pod": ' + pod + b', "NodeNames": null, "Nodes": {"items": ['
               + ",".join(items[:-1]).encode() + b"]}}")
    many = json.dumps({"Pod": POD, "NodeNames": [f"n{i}" for i in range(200)] + [
        f"unknown-{i:05d}-" + "x" * 200 for i in range(19_800)]}).encode()
    print("probes (healthz, small filter) while one huge filter is in flight, per try: "
          "huge status and seconds; probe median / max ms (count)")
    for label, body in (("58 MiB, 4M names", names), ("16 MiB Node objects", objects),
                        ("20,000 names (5 MiB)", many)):
        print(f"  {label}:")
        for _ in range(tries):
            status, seconds, lat = probe_during(srv, body)
            text = "  ".join(
                f"{k} {statistics.median(v) * 1000:6.1f} / {max(v) * 1000:6.1f} ({len(v)})"
                if v else f"{k} -" for k, v in lat.items())
            print(f"    {status} {seconds:6.2f} s   {text}")
    srv.stop()


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__)
    args.add_argument("--tries", type=int, default=5)
    options = args.parse_args()
    decode_costs()
    stalls(options.tries)


if __name__ == "__main__":
    main()
