"""One huge request does not hold up the others: while it is sent, decoded and planned,
health checks and small filters on other connections keep answering within 100 ms.

Real aiohttp server (its own event loop thread), real sockets. Timing on a shared 2-core
machine is noisy, so each case gets up to three tries and passes on the first whose slowest
probe (of those started while the huge request was in flight) stayed under the bound; a stall
of the event loop delays every probe that overlaps it, in every try. Before the edge was
bounded, the 58 MiB body below held the loop for seconds.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.client import HTTPConnection
from typing import Any

import pytest

from egpu_testing.workbench import ServedExtender, pod_manifest, ready_state, send_raw
from elastic_gpu.core.model import Card, Node
from elastic_gpu.scheduler.server import Extender

BOUND_S = 0.100
NODES = [Node(f"n{i}", 64_000, 256_000, tuple(Card(c, f"GPU-{i}-{c}", "A100", 16384)
                                             for c in range(4))) for i in range(200)]
POD = pod_manifest("probe", uid="uid-probe", limits={"elasticgpu.io/gpu-core": "30"})
SMALL_FILTER = json.dumps({"Pod": POD, "NodeNames": ["n0", "n1", "n2"]}).encode()


@pytest.fixture(scope="module")
def server() -> Iterator[ServedExtender]:
    srv = ServedExtender(Extender(ready_state(NODES)))
    yield srv
    srv.stop()


def _send(port: int, head: bytes, body: bytes) -> int:
    return send_raw(port, head, body, timeout_s=60)


def _probe_during(srv: ServedExtender, huge: Callable[[], int]) -> tuple[int, dict[str, list[float]]]:
    """Run `huge` on one thread while healthz and small filters probe on two others; return
    its status and, per probe kind, the latencies of probes started while it was in flight."""
    done = threading.Event()
    started = threading.Event()
    latencies: dict[str, list[float]] = {"healthz": [], "filter": []}
    status: list[int] = []

    def run_huge() -> None:
        started.set()
        try:
            status.append(huge())
        finally:
            done.set()

    def probe(kind: str) -> None:
        conn = HTTPConnection("127.0.0.1", srv.port, timeout=60)
        started.wait(10)
        while not done.is_set():
            overlapped = not done.is_set()  # started while the huge request was in flight
            t0 = time.perf_counter()
            if kind == "healthz":
                code, _ = srv.get("/healthz", conn)
            else:
                code, answer = srv.post("/filter", SMALL_FILTER, conn)
                assert answer["NodeNames"] == ["n0", "n1", "n2"]
            elapsed = time.perf_counter() - t0
            assert code == 200
            if overlapped:
                latencies[kind].append(elapsed)
            time.sleep(0.002)
        conn.close()

    probes = [threading.Thread(target=probe, args=(kind,)) for kind in latencies]
    for thread in probes:
        thread.start()
    worker = threading.Thread(target=run_huge)
    time.sleep(0.05)  # probes connected and warm
    worker.start()
    worker.join(120)
    for thread in probes:
        thread.join(60)
    return status[0], latencies


def _never_stalled(srv: ServedExtender, huge: Callable[[], int], expected: int) -> None:
    worst: list[str] = []
    for _ in range(3):
        status, latencies = _probe_during(srv, huge)
        assert all(latencies.values()), latencies  # the probes did overlap the huge request
        slowest = {kind: max(values) for kind, values in latencies.items()}
        if all(v < BOUND_S for v in slowest.values()):
            assert status == expected
            return
        worst.append(", ".join(f"{k} {v * 1000:.0f} ms of {len(latencies[k])} probes"
                               for k, v in slowest.items()))
    pytest.fail(f"a probe waited more than {BOUND_S * 1000:.0f} ms in every try: {worst}")


def test_the_issue_58_mib_filter_does_not_stall_health_or_filters(server: ServedExtender) -> None:
    body = b'{"Pod": ' + json.dumps(POD).encode() + b', "NodeNames": [' + b",".join(
        b'"node-%07d"' % i for i in range(4_000_000)) + b"]}"
    assert len(body) > 57 * 2**20  # the issue's "58 MiB" (60 MB)
    _never_stalled(server, lambda: _send(server.port, b"POST /filter HTTP/1.1\r\nHost: x\r\n",
                                         body), expected=413)


def test_the_largest_accepted_filter_does_not_stall_health_or_filters(
        server: ServedExtender) -> None:
    # Whole Node objects (a non-nodeCacheCapable kube-scheduler) up to the 16 MiB default:
    # read, decoded node by node and planned in a worker thread.
    def node(i: int) -> dict[str, Any]:
        return {"metadata": {"name": f"n{i}" if i < 200 else f"big-{i}",
                             "labels": {f"label-{j}": "v" * 40 for j in range(20)}},
                "status": {"images": [{"names": [f"registry.example.com/image-{i}-{j}:tag"],
                                       "sizeBytes": 123456789} for j in range(40)]}}

    items = []
    size = 0
    while True:
        item = json.dumps(node(len(items)))
        if size + len(item) > 16 * 2**20 - 10_000:
            break
        items.append(item)
        size += len(item) + 1
    body = (b'{"Pod": ' + json.dumps(POD).encode() + b', "NodeNames": null, "Nodes": {"items": ['
            + ",".join(items).encode() + b"]}}")
    assert 15 * 2**20 < len(body) <= 16 * 2**20

    def huge() -> int:
        conn = HTTPConnection("127.0.0.1", server.port, timeout=60)
        status, answer = server.post("/filter", body, conn)
        assert len(answer["Nodes"]["items"]) == 200  # every real node has room
        conn.close()
        return status

    _never_stalled(server, huge, expected=200)


def test_the_largest_accepted_name_list_does_not_stall_health_or_filters(
        server: ServedExtender) -> None:
    names = [f"n{i}" for i in range(200)] + [f"unknown-{i:05d}-" + "x" * 200
                                             for i in range(19_800)]
    body = json.dumps({"Pod": POD, "NodeNames": names}).encode()

    def huge() -> int:
        conn = HTTPConnection("127.0.0.1", server.port, timeout=60)
        status, answer = server.post("/filter", body, conn)
        assert len(answer["NodeNames"]) == 200
        conn.close()
        return status

    _never_stalled(server, huge, expected=200)
