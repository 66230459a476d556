"""The extender over HTTP/2 (`runtime.http2`, TLS with ALPN `h2`, as kube-scheduler's Go
client negotiates it): every verb, health, readiness and metrics on one connection, answered
as over HTTP/1.1; bodies over their limit refused as they arrive; a broken frame ends only its
own connection; a reset stream leaves its connection idle, not busy."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from egpu_testing.h2client import H2Client
from egpu_testing.workbench import ServedExtender, TestPki, metric_value, pod_manifest, ready_state
from elastic_gpu.core.model import Card, Node
from elastic_gpu.scheduler.app import ServeOptions, tls_context
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.state import SchedulerState

NODES = [Node(f"n{i}", 64_000, 256_000, tuple(Card(c, f"GPU-{i}-{c}", "A100", 40960)
                                               for c in range(4))) for i in range(6)]


@pytest.fixture
def pki(tmp_path: Path) -> TestPki:
    return TestPki.create(tmp_path)


@pytest.fixture
def served(pki: TestPki) -> Iterator[ServedExtender]:
    context = tls_context(ServeOptions(tls_cert=pki.server_cert, tls_key=pki.server_key,
                                       tls_client_ca=pki.ca))
    extender = Extender(ready_state(NODES, SchedulerState(SchedulerConfig())))
    server = ServedExtender(extender, tls=context)
    yield server
    server.stop()


def filter_body(i: int) -> bytes:
    pod = pod_manifest(f"p{i}", uid=f"u{i}", limits={"nvidia.com/gpu": "1"})
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = f"{100 + i}m"
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": [n.name for n in NODES]}).encode()


def test_verbs_health_and_metrics_on_one_http2_connection(served: ServedExtender,
                                                           pki: TestPki) -> None:
    client = H2Client(served.port, pki.client_context())
    assert client.protocol == "h2"  # the extender's TLS context offers it first
    filters = [client.send("POST", "/filter", filter_body(i),
                           headers=(("content-type", "application/json"),)) for i in range(5)]
    others = {path: client.send("GET", path) for path in ("/healthz", "/readyz", "/metrics")}
    replies = client.wait(*filters, *others.values())
    for i, stream in enumerate(filters):  # all five in flight at once, each answered alike
        reply = replies[stream]
        assert reply.status == 200 and reply.headers["content-type"].startswith("application/json")
        expected = served.extender.filter(filter_body(i)).body
        assert json.loads(reply.body) == json.loads(expected)
        assert json.loads(reply.body)["NodeNames"]  # a node fits
    assert (replies[others["/healthz"]].status, replies[others["/healthz"]].body) == (200, b"ok")
    assert (replies[others["/readyz"]].status, replies[others["/readyz"]].body) == (200, b"ok")
    page = replies[others["/metrics"]]
    assert page.status == 200 and page.headers["content-type"].startswith("text/plain")
    text = page.body.decode()
    assert metric_value(text, 'elasticgpu_scheduler_requests_total'
                              '{outcome="feasible",verb="filter"}') == 5
    # nine requests, one connection: no handshake per request
    assert served.gate.accepted_count == 1
    unknown = client.send("GET", "/nowhere")
    wrong = client.send("GET", "/bind")
    posted = client.send("POST", "/nowhere", b"{}")
    health_body = client.send("GET", "/healthz", b"{}")
    replies = client.wait(unknown, wrong, posted, health_body)
    assert [replies[s].status for s in (unknown, wrong, posted, health_body)] == \
        [404, 405, 404, 413]
    client.close()


def test_a_client_without_http2_is_served_http1_on_the_same_port(served: ServedExtender,
                                                                 pki: TestPki) -> None:
    from http.client import HTTPSConnection

    conn = HTTPSConnection("127.0.0.1", served.port, context=pki.client_context(), timeout=30)
    conn.request("POST", "/filter", body=filter_body(1),
                 headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200 and json.loads(response.read())["NodeNames"]
    conn.close()


def test_bodies_over_the_limit_are_refused_as_they_arrive(served: ServedExtender,
                                                          pki: TestPki) -> None:
    client = H2Client(served.port, pki.client_context())
    claimed = client.send("POST", "/bind", length=10_000_000, end=False)  # refused on its header
    streamed = client.send("POST", "/bind", b"x" * 200_000)  # no length claimed past the body
    replies = client.wait(claimed, streamed)
    for reply in replies.values():
        assert reply.status == 413
        assert "over the limit of 65536 bytes (a bind's body is four names)" in \
            json.loads(reply.body)["Error"]
    after = client.send("GET", "/healthz")  # the connection serves on
    assert client.wait(after)[after].status == 200
    page = client.send("GET", "/metrics")
    text = client.wait(page)[page].body.decode()
    assert metric_value(text, 'elasticgpu_scheduler_requests_total'
                              '{outcome="bad_request",verb="bind"}') == 2
    assert metric_value(text, 'elasticgpu_scheduler_bad_requests_total{verb="bind"}') == 2
    client.close()


def test_a_broken_frame_ends_only_its_own_connection(served: ServedExtender,
                                                     pki: TestPki) -> None:
    broken = H2Client(served.port, pki.client_context())
    ok = broken.send("GET", "/healthz")
    assert broken.wait(ok)[ok].status == 200
    # a DATA frame on stream 0 (RFC 9113 6.1: a connection error of type PROTOCOL_ERROR)
    broken.raw(b"\x00\x00\x01\x00\x00\x00\x00\x00\x00" + b"x")
    assert broken.wait_closed()
    other = H2Client(served.port, pki.client_context())
    stream = other.send("POST", "/filter", filter_body(2))
    assert other.wait(stream)[stream].status == 200
    other.close()
    broken.close()


def test_a_reset_request_leaves_its_connection_idle(served: ServedExtender,
                                                    pki: TestPki) -> None:
    """A request in progress keeps the gate from closing its connection; a stream the client
    abandons (headers, no end, then RST_STREAM) is no request in progress."""
    client = H2Client(served.port, pki.client_context())
    stream = client.send("POST", "/filter", end=False)
    client.reset(stream)
    done = client.send("GET", "/healthz")  # after the reset, in order
    assert client.wait(done)[done].status == 200
    asyncio.run_coroutine_threadsafe(_close_idle(served), served.loop).result(10)
    assert client.wait_closed()  # idle: closed by the gate
    assert client.goaway  # with a GOAWAY first: the client knows to retry elsewhere


async def _close_idle(served: ServedExtender) -> None:
    served.gate.close_idle()


def test_an_open_request_keeps_its_connection(served: ServedExtender, pki: TestPki) -> None:
    client = H2Client(served.port, pki.client_context())
    client.send("POST", "/filter", end=False)  # headers only: a request in progress
    probe = client.send("GET", "/healthz")
    assert client.wait(probe)[probe].status == 200
    asyncio.run_coroutine_threadsafe(_close_idle(served), served.loop).result(10)
    later = client.send("GET", "/healthz")
    assert client.wait(later)[later].status == 200  # not closed: busy
    client.close()


def test_without_client_certificate_no_http2_either(served: ServedExtender,
                                                    pki: TestPki) -> None:
    # TLS 1.3: the server refuses the certificate after the client's side of the handshake,
    # so the refusal shows at the handshake or at the first read
    try:
        client = H2Client(served.port, pki.client_context(cert=False))
        stream = client.send("GET", "/healthz")
        reply = client.wait(stream)[stream]
    except (ssl.SSLError, ConnectionError, OSError):
        return
    assert reply.status == 0 and client.closed  # never answered


def test_bodies_past_the_buffer_are_refused_for_retry(served: ServedExtender,
                                                       pki: TestPki) -> None:
    """Bodies buffered at once are bounded over every connection of the server
    (`BodyBudget`, HTTP/1.1's too): a stream that would pass the bound is reset REFUSED_STREAM
    (RFC 9113 8.7: safe to retry), and the bytes of finished streams are given back."""
    served.gate.body_budget.limit = 1000
    client = H2Client(served.port, pki.client_context())
    held = client.send("POST", "/filter", b"x" * 800, end=False)  # buffered, not ended
    refused = client.send("POST", "/filter", filter_body(3))  # past 1,000 bytes with it
    assert client.wait(refused)[refused].reset == 7  # REFUSED_STREAM
    client.reset(held)  # its bytes are given back: the next one fits
    small = client.send("POST", "/bind", b"x" * 500)
    assert client.wait(small)[small].status == 400  # read whole, then refused as not JSON
    assert served.gate.body_budget.held == 0  # every stream finished
    client.close()


def test_headers_past_16_kib_end_the_connection(served: ServedExtender, pki: TestPki) -> None:
    client = H2Client(served.port, pki.client_context())
    client.send("GET", "/healthz", headers=(("x-filler", "a" * 20_000),))
    assert client.wait_closed()
    other = H2Client(served.port, pki.client_context())  # the server serves on
    stream = other.send("GET", "/healthz")
    assert other.wait(stream)[stream].status == 200
    other.close()
    client.close()


def test_an_answer_past_the_clients_window_is_sent_as_the_client_opens_it(pki: TestPki) -> None:
    """The client's flow-control window is 64 KiB until it acknowledges data (RFC 9113 6.9):
    a larger answer (the metrics page of 300 nodes' cards) goes out window by window."""
    context = tls_context(ServeOptions(tls_cert=pki.server_cert, tls_key=pki.server_key,
                                       tls_client_ca=pki.ca))
    nodes = [Node(f"n{i}", 64_000, 256_000, tuple(Card(c, f"GPU-{i}-{c}", "A100", 40960)
                                                  for c in range(4))) for i in range(300)]
    served = ServedExtender(Extender(ready_state(nodes, SchedulerState(SchedulerConfig()))),
                            tls=context)
    try:
        client = H2Client(served.port, pki.client_context())
        page = client.send("GET", "/metrics")
        reply = client.wait(page)[page]
        assert reply.status == 200 and len(reply.body) > 4 * 65_535
        assert len(reply.body) == int(reply.headers["content-length"])
        assert reply.body.decode().count('node="n299"') >= 4  # the last node's cards, whole
        client.close()
    finally:
        served.stop()


def test_a_body_that_does_not_arrive_in_time_gets_408_and_its_stream_reset(pki: TestPki) -> None:
    context = tls_context(ServeOptions(tls_cert=pki.server_cert, tls_key=pki.server_key,
                                       tls_client_ca=pki.ca))
    extender = Extender(ready_state(NODES, SchedulerState(SchedulerConfig(
        bodyTimeoutSeconds=0.5))))
    server = ServedExtender(extender, tls=context)
    try:
        client = H2Client(server.port, pki.client_context())
        stalled = client.send("POST", "/filter", b"x" * 100, end=False, length=900)
        reply = client.wait(stalled)[stalled]
        assert reply.status == 408
        assert "did not arrive within 0.5 s of its headers (bodyTimeoutSeconds)" in \
            reply.body.decode()
        assert server.gate.body_budget.held == 0  # its 100 bytes given back
        after = client.send("POST", "/filter", filter_body(2))  # the connection serves on
        assert client.wait(after)[after].status == 200
        assert server.gate.body_timeouts == 1  # counted (`GateCollector`'s metric)
        client.close()
    finally:
        server.stop()
