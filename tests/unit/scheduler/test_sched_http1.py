"""The extender's own HTTP/1.1 server (`runtime.http1`), as `egpu scheduler` serves it behind
its connection gate: kept-alive and pipelined requests answered in order, chunked bodies,
`Expect: 100-continue`, HEAD, HTTP/1.0 and `Connection: close`; what cannot be framed safely
(both lengths, another coding, a malformed head or chunk) refused with a 4xx/5xx that says why
and the connection closed; request bodies bounded over every connection; a client that leaves
mid-bind loses nothing of the bind."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from egpu_testing.workbench import ServedExtender, metric_value, pod_manifest, ready_state
from elastic_gpu.core.model import Card, Node
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.state import SchedulerState

NODES = [Node(f"n{i}", 64_000, 256_000, tuple(Card(c, f"GPU-{i}-{c}", "A100", 40960)
                                               for c in range(4))) for i in range(6)]


class HeldApi:
    """PodApi whose Bindings wait for `release` (set by the test)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.bound: list[tuple[str, str]] = []

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   resource_version: int | None, annotations: Mapping[str, str]) -> None:
        import asyncio

        self.entered.set()
        while not self.release.is_set():
            await asyncio.sleep(0.01)
        self.bound.append((f"{namespace}/{name}", node))


@pytest.fixture
def api() -> HeldApi:
    return HeldApi()


@pytest.fixture
def served(api: HeldApi) -> Iterator[ServedExtender]:
    server = ServedExtender(Extender(ready_state(NODES, SchedulerState(SchedulerConfig())), api))
    yield server
    server.stop()


def filter_body(i: int) -> bytes:
    pod = pod_manifest(f"p{i}", uid=f"u{i}", limits={"nvidia.com/gpu": "1"})
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": [n.name for n in NODES]}).encode()


def post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def eventually(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    """Whether `check` holds within `seconds` (the server's thread runs beside the test's)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


class Wire:
    """A raw connection: bytes out, answers read as RFC 9112 frames them."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buf += chunk
        return bool(chunk)

    def answer(self, head_only: bool = False) -> Answer:
        while b"\r\n\r\n" not in self.buf:
            assert self._fill(), f"closed before an answer: {self.buf!r}"
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in
                   (line.partition(":") for line in lines[1:])}
        size = 0 if head_only else int(headers.get("content-length", "0"))
        while len(self.buf) < size:
            assert self._fill(), "closed in the middle of a body"
        body, self.buf = self.buf[:size], self.buf[size:]
        return Answer(status, headers, body)

    def closed(self) -> bool:
        """Whether the server closed the connection (EOF or reset) with nothing more sent."""
        try:
            return not self._fill() and not self.buf
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


def test_requests_on_one_kept_alive_connection_and_pipelined_ones_in_order(
        served: ServedExtender) -> None:
    before = served.gate.accepted_count
    wire = Wire(served.port)
    wire.send(post("/filter", filter_body(1)))
    first = wire.answer()
    assert first.status == 200 and first.headers["content-type"].startswith("application/json")
    assert first.json()["NodeNames"] and "connection" not in first.headers
    # three requests in one write: answered one after another, in the order sent
    wire.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + post("/filter", filter_body(2)) +
              b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
    answers = [wire.answer() for _ in range(3)]
    assert [a.status for a in answers] == [200, 200, 200]
    assert answers[0].body == b"ok" and answers[2].body == b"ok"
    assert answers[1].json()["NodeNames"]
    assert served.gate.accepted_count == before + 1  # all on the one connection
    wire.close()


def test_a_chunked_body_is_read_whole_and_trailers_dropped(served: ServedExtender) -> None:
    body = filter_body(3)
    pieces = [body[i:i + 700] for i in range(0, len(body), 700)]
    chunked = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces)
    wire = Wire(served.port)
    wire.send(b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    for i in range(0, len(chunked), 333):  # in odd slices: sizes and data split anywhere
        wire.send(chunked[i:i + 333])
        time.sleep(0.001)
    wire.send(b"0\r\nX-Trailer: y\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = wire.answer()
    assert answer.status == 200 and answer.json()["NodeNames"]
    assert wire.answer().body == b"ok"  # the next request starts right after the trailer
    wire.close()


@pytest.mark.parametrize(("request_bytes", "status", "says"), [
    (b"POST /filter HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
     400, "both Content-Length and Transfer-Encoding"),
    (b"POST /filter HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501,
     "Transfer-Encoding 'gzip' is not served"),
    (b"POST /filter HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400,
     "two different Content-Length headers"),
    (b"POST /filter HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "malformed Content-Length"),
    (b"POST /filter HTTP/1.1\r\nContent-Length : 5\r\n\r\nhello", 400, "malformed header line"),
    (b"POST /filter HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", 400, "malformed header line"),
    (b"GET /healthz\r\n\r\n", 400, "malformed request line"),
    (b"get /healthz HTTP/1.1\r\n\r\n", 400, "malformed request line"),
    (b"GET healthz HTTP/1.1\r\n\r\n", 400, "is not a path"),
    (b"GET /healthz HTTP/2.0\r\n\r\n", 505, "HTTP/2.0 is not served"),
    (b"GET /he\x00althz HTTP/1.1\r\n\r\n", 400, "a NUL in the request head"),
    (b"POST /filter HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400,
     "malformed chunk size"),
    (b"POST /filter HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY", 400,
     "not followed by CRLF"),
])
def test_what_cannot_be_framed_safely_is_refused_and_the_connection_closed(
        served: ServedExtender, request_bytes: bytes, status: int, says: str) -> None:
    wire = Wire(served.port)
    wire.send(request_bytes)
    answer = wire.answer()
    assert answer.status == status and says in answer.body.decode()
    assert answer.headers["connection"] == "close"
    assert wire.closed()
    wire.close()
    # and the server goes on
    again = Wire(served.port)
    again.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert again.answer().body == b"ok"
    again.close()


def test_a_head_past_16_kib_gets_431(served: ServedExtender) -> None:
    wire = Wire(served.port)
    wire.send(b"GET /healthz HTTP/1.1\r\nX-Filler: " + b"a" * 20_000)  # no end in sight
    answer = wire.answer()
    assert answer.status == 431 and "request head over 16384 bytes" in answer.body.decode()
    assert wire.closed()
    wire.close()


def test_expect_100_continue_is_answered_once_the_body_may_come(served: ServedExtender) -> None:
    body = filter_body(4)
    wire = Wire(served.port)
    wire.send(post("/filter", b"", "Expect: 100-continue").replace(
        b"Content-Length: 0", f"Content-Length: {len(body)}".encode()))
    interim = wire.answer(head_only=True)
    assert interim.status == 100
    wire.send(body)
    assert wire.answer().json()["NodeNames"]
    # a body past its limit: 413 at once, no 100, and nothing of the body is read
    wire.send(b"POST /bind HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
              b"Content-Length: 100000\r\n\r\n")
    refused = wire.answer()
    assert refused.status == 413 and "a bind's body is four names" in refused.json()["Error"]
    assert wire.closed()
    wire.close()


def test_http_1_0_head_and_connection_close(served: ServedExtender) -> None:
    wire = Wire(served.port)
    wire.send(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    head = wire.answer(head_only=True)
    assert head.status == 200 and head.headers["content-length"] == "2"
    wire.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert wire.answer().body == b"ok"  # nothing of a body followed the HEAD answer
    wire.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    last = wire.answer()
    assert last.body == b"ok" and last.headers["connection"] == "close" and wire.closed()
    wire.close()
    old = Wire(served.port)
    old.send(b"GET /healthz HTTP/1.0\r\n\r\n")
    assert old.answer().headers["connection"] == "close" and old.closed()
    old.close()
    kept = Wire(served.port)  # HTTP/1.0 that asks to keep the connection keeps it
    kept.send(b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" * 2)
    assert [kept.answer().body for _ in range(2)] == [b"ok", b"ok"]
    kept.close()


def test_unknown_paths_and_methods(served: ServedExtender) -> None:
    wire = Wire(served.port)
    wire.send(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\nGET /filter HTTP/1.1\r\nHost: x\r\n\r\n")
    assert wire.answer().status == 404
    wrong = wire.answer()
    assert wrong.status == 405 and wrong.headers["allow"] == "POST"
    wire.send(post("/healthz", b"abc"))
    assert wire.answer().status == 413  # a GET path takes no body
    wire.close()


def test_bodies_past_the_shared_budget_get_429_and_are_given_back(
        served: ServedExtender) -> None:
    served.gate.body_budget.limit = 1000
    held = Wire(served.port)
    held.send(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\n" + b"x" * 800)
    time.sleep(0.2)  # 800 bytes held, the rest not sent
    wire = Wire(served.port)
    wire.send(post("/bind", b"x" * 500))
    busy = wire.answer()
    assert busy.status == 429 and busy.headers["retry-after"] == "1"
    assert "retry shortly" in busy.body.decode() and wire.closed()
    wire.close()
    held.close()  # its 800 bytes are given back when it goes
    assert eventually(lambda: served.gate.body_budget.held == 0)
    again = Wire(served.port)
    again.send(post("/bind", b"x" * 500))
    assert again.answer().status == 400  # read whole, then refused as not JSON
    again.close()
    assert eventually(lambda: served.gate.body_budget.held == 0)  # after the answer's write


def test_a_client_gone_mid_bind_loses_nothing_of_the_bind(served: ServedExtender,
                                                          api: HeldApi) -> None:
    pod = pod_manifest("b", uid="uid-b", limits={"nvidia.com/gpu": "1"})
    pod["metadata"]["resourceVersion"] = "3"
    served.extender.state.observe_pod(pod)
    wire = Wire(served.port)
    wire.send(post("/bind", json.dumps({"PodName": "b", "PodNamespace": "default",
                                        "PodUID": "uid-b", "Node": "n0"}).encode()))
    assert api.entered.wait(10)
    wire.close()  # kube-scheduler timed out and dropped the connection
    time.sleep(0.1)
    api.release.set()
    assert eventually(lambda: bool(api.bound) and served.gate.open_count == 0)
    assert api.bound == [("default/b", "n0")]  # the Binding was still written and settled
    assert served.extender.state.holds()["uid-b"].node == "n0"  # settled: the pod holds its card
    assert served.gate.open_count == 0 and served.gate.body_budget.held == 0
    status, _ = served.post("/bind", {"PodName": "b", "PodNamespace": "default",
                                      "PodUID": "uid-b", "Node": "n0"})
    assert status == 200  # the retry finds it done
    page = served.get("/metrics")[1]
    assert metric_value(page, 'elasticgpu_scheduler_requests_total{verb="bind",'
                              'outcome="bound"}') == 2


def test_a_client_that_does_not_read_gets_no_more_answers_and_meets_the_idle_timeout(
        api: HeldApi) -> None:
    server = ServedExtender(Extender(ready_state(NODES, SchedulerState(
        SchedulerConfig(idleTimeoutSeconds=1))), api))
    try:
        routes = server.extender.routes
        page = routes.page
        pages: list[int] = []

        async def counted(accept: str) -> Any:
            pages.append(1)
            return await page(accept)

        routes.page = counted
        wire = Wire(server.port)
        wire.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 2000)  # ~50 MB of answers
        assert eventually(lambda: server.gate.timeouts == 1 and server.gate.open_count == 0)
        # answered only while the client's socket and the transport took them in
        assert 0 < len(pages) < 1000
        wire.close()
    finally:
        server.stop()


def test_a_body_that_does_not_arrive_in_time_gets_408_and_its_connection_closes(
        api: HeldApi) -> None:
    """A request being read is in progress (the idle timer leaves it alone): without a bound
    on its body, a client trickling one would hold its connection and its bytes for ever."""
    server = ServedExtender(Extender(ready_state(NODES, SchedulerState(
        SchedulerConfig(bodyTimeoutSeconds=0.5))), api))
    try:
        stalled = Wire(server.port)  # a part of the body, then nothing
        stalled.send(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\n"
                     + b"x" * 100)
        late = stalled.answer()
        assert late.status == 408 and late.headers["connection"] == "close"
        assert "did not arrive within 0.5 s of its headers (bodyTimeoutSeconds)" in \
            late.body.decode()
        assert stalled.closed()
        trickle = Wire(server.port)  # a byte at a time, each sooner than the limit
        trickle.send(b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(8):  # the answer comes meanwhile; these land in its lingering close
            trickle.send(b"1\r\nx\r\n")
            time.sleep(0.1)
        assert trickle.answer().status == 408  # the limit is the whole body's
        kept = Wire(server.port)  # a body in two parts, in time: answered, and the
        body = filter_body(1)     # connection's next request is not timed out with it
        kept.send(post("/filter", body)[:-len(body)])
        time.sleep(0.2)
        kept.send(body)
        assert kept.answer().status == 200
        time.sleep(0.6)
        kept.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert kept.answer().status == 200
        assert eventually(lambda: server.gate.open_count == 1)  # the other two closed
        assert server.gate.body_budget.held == 0  # what they had sent was given back
        assert server.gate.body_timeouts == 2  # counted (`GateCollector`'s metric)
        for wire in (stalled, trickle, kept):
            wire.close()
    finally:
        server.stop()
