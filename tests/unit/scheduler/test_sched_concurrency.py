"""One huge request does not hold up the others: while it is sent, read, decoded and planned,
health checks and small filters on other connections are answered.

Real aiohttp server (its own event loop thread), real sockets. Each huge request is held at a
known point, by the test, while the probes run: half its body sent and the rest withheld (the
server is reading it), then inside the verb itself (a hook around the extender's `filter` that
waits for the test's release). Every probe must be answered while the huge request is held
there, which can only happen if reading is asynchronous and the verb runs off the event loop:
a verb run on the loop would hold the loop with it, and the probes would never be answered
(their sockets time out). No probe is timed. Before the edge was bounded, the 58 MiB body below
held the loop for seconds; it is now refused before its body is read.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from http.client import HTTPConnection
from typing import Any

import pytest

from egpu_testing.workbench import ServedExtender, pod_manifest, ready_state
from elastic_gpu.core.model import Card, Node
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.handle import LARGE_BODY_BYTES
from elastic_gpu.scheduler.state import SchedulerState

NODES = [Node(f"n{i}", 64_000, 256_000, tuple(Card(c, f"GPU-{i}-{c}", "A100", 16384)
                                             for c in range(4))) for i in range(200)]
POD = pod_manifest("probe", uid="uid-probe", limits={"elasticgpu.io/gpu-core": "30"})
SMALL_FILTER = json.dumps({"Pod": POD, "NodeNames": ["n0", "n1", "n2"]}).encode()
#: a probe that is not answered in this long is taken as a held event loop
PROBE_TIMEOUT_S = 60
PROBES = 5


class HeldFilter:
    """Wraps the extender's `filter`: a call with a large body signals `entered`, then waits
    for `release` before running the real verb (on whatever thread the server chose)."""

    def __init__(self, real: Callable[[bytes], Any]) -> None:
        self.real = real
        self.entered = threading.Event()
        self.release = threading.Event()
        self.on_loop: list[bool] = []

    def __call__(self, body: bytes) -> Any:
        if len(body) > LARGE_BODY_BYTES:
            self.entered.set()
            # never forever: a verb held on the event loop must end so the test can fail
            self.release.wait(PROBE_TIMEOUT_S * 2)
        return self.real(body)


@pytest.fixture
def held() -> Iterator[tuple[ServedExtender, HeldFilter]]:
    # every node that fits (`filterResult: all`): the tests read whole answers
    extender = Extender(ready_state(NODES, SchedulerState(SchedulerConfig(filter_result="all"))))
    hook = HeldFilter(extender.filter)
    extender.filter = hook  # type: ignore[method-assign]  # before app() binds the routes
    srv = ServedExtender(extender)
    yield srv, hook
    hook.release.set()
    srv.stop()


def probes_answered(srv: ServedExtender) -> None:
    """Health checks and small filters on a connection of their own, each answered."""
    conn = HTTPConnection("127.0.0.1", srv.port, timeout=PROBE_TIMEOUT_S)
    try:
        for _ in range(PROBES):
            code, _ = srv.get("/healthz", conn)
            assert code == 200
            code, answer = srv.post("/filter", SMALL_FILTER, conn)
            assert (code, answer["NodeNames"]) == (200, ["n0", "n1", "n2"])
    finally:
        conn.close()


def answer_status(sock: socket.socket) -> int:
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0


def read_body(sock: socket.socket, data: bytes) -> bytes:
    """The rest of an answer whose head may be in `data` (Content-Length framed)."""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def held_huge_filter(srv: ServedExtender, hook: HeldFilter, body: bytes) -> dict[str, Any]:
    """Send `body` to /filter with the probes answered twice while it is in flight: with half
    of it withheld, and with the verb held by the hook; then its answer."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=PROBE_TIMEOUT_S) as sock:
        sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body))
        half = len(body) // 2
        sock.sendall(body[:half])
        probes_answered(srv)  # the server is reading the huge body
        assert not hook.entered.is_set()
        sock.sendall(body[half:])
        assert hook.entered.wait(PROBE_TIMEOUT_S), "the large filter never reached the verb"
        probes_answered(srv)  # the huge verb is running (held)
        hook.release.set()
        raw = read_body(sock, b"")
    status = int(raw.split(b" ", 2)[1])
    assert status == 200, raw[:500]
    answer: dict[str, Any] = json.loads(raw.partition(b"\r\n\r\n")[2])
    return answer


def test_the_issue_58_mib_filter_is_refused_before_its_body_is_read(
        held: tuple[ServedExtender, HeldFilter]) -> None:
    srv, hook = held
    size = 60_000_000  # the issue's "58 MiB"
    with socket.create_connection(("127.0.0.1", srv.port), timeout=PROBE_TIMEOUT_S) as sock:
        sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size
                     + b'{"Pod": ' + json.dumps(POD).encode() + b', "NodeNames": [')
        # nothing more is sent: the answer comes from the Content-Length alone
        assert answer_status(sock) == 413
        probes_answered(srv)
    assert not hook.entered.is_set()


def test_the_largest_accepted_filter_does_not_hold_up_health_or_filters(
        held: tuple[ServedExtender, HeldFilter]) -> None:
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
    srv, hook = held
    answer = held_huge_filter(srv, hook, body)
    assert len(answer["Nodes"]["items"]) == 200  # every real node has room


def test_the_largest_accepted_name_list_does_not_hold_up_health_or_filters(
        held: tuple[ServedExtender, HeldFilter]) -> None:
    names = [f"n{i}" for i in range(200)] + [f"unknown-{i:05d}-" + "x" * 200
                                             for i in range(19_800)]
    body = json.dumps({"Pod": POD, "NodeNames": names}).encode()
    srv, hook = held
    answer = held_huge_filter(srv, hook, body)
    assert len(answer["NodeNames"]) == 200
