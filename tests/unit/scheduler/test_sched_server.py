"""The extender over HTTP: verbs answer in kube-scheduler's format; bad input never a 500."""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egpu_testing.workbench import ServedExtender, metric_value, pod_manifest, ready_state
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.resources import RESOURCE_TABLE
from elastic_gpu.scheduler.binder import with_binding
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.state import SchedulerState

NODES = [Node(f"n{i}", 64_000, 256_000,
              tuple(Card(c, f"GPU-{i}-{c}", "A100" if i % 2 else "T4", 16384) for c in range(2)))
         for i in range(4)]


Server = ServedExtender  # the extender's app on a loopback port, served from a thread


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    # every node that fits (`filterResult: all`): these tests read whole answers
    srv = Server(Extender(ready_state(NODES, SchedulerState(SchedulerConfig(filter_result="all")))))
    yield srv
    srv.stop()


def gpu_pod(name: str, **limits: str) -> dict[str, Any]:
    return pod_manifest(name, uid=f"uid-{name}", limits=limits or {"elasticgpu.io/gpu-core": "30"})


def test_filter_answers_with_go_field_names(server: Server) -> None:
    pod = pod_manifest("p", uid="u1", limits={"nvidia.com/gpu": "2"},
                       annotations={"elasticgpu.io/gpu-model": "A100"})
    status, body = server.post("/filter", {"Pod": pod, "Nodes": None,
                                           "NodeNames": ["n0", "n1", "n3", "ghost"]})
    assert status == 200
    assert set(body) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes",
                         "Error"}
    assert body["Error"] == ""
    assert body["NodeNames"] == ["n1", "n3"]
    # a node fits: no reasons (kube-scheduler reads them only when none fits)
    assert body["FailedNodes"] == {} and body["FailedAndUnresolvableNodes"] == {}
    status, body = server.post("/filter", {"Pod": pod, "Nodes": None,
                                           "NodeNames": ["n0", "n2", "ghost"]})
    assert status == 200 and body["NodeNames"] == []
    # one sentence per failure, without the node's name (kube-scheduler counts identical ones)
    assert body["FailedNodes"] == {"n0": "the node has T4 cards; the pod accepts A100",
                                   "n2": "the node has T4 cards; the pod accepts A100"}
    assert body["FailedAndUnresolvableNodes"] == {"ghost": "node unknown to the GPU scheduler"}


def test_filter_gives_no_reasons_when_a_node_fits(server: Server) -> None:
    """kube-scheduler drops the failed nodes' reasons when some node passes (`schedulePod`
    reads them only for a FitError): the answer leaves them out."""
    pod = pod_manifest("p", uid="u1", limits={"nvidia.com/gpu": "2"},
                       annotations={"elasticgpu.io/gpu-model": "T4"})
    status, body = server.post("/filter", {"Pod": pod, "Nodes": None,
                                           "NodeNames": ["n0", "n1", "n2", "n3", "ghost"]})
    assert status == 200 and body["NodeNames"] == ["n0", "n2"]
    assert body["FailedNodes"] == {} and body["FailedAndUnresolvableNodes"] == {}


def test_prioritize_returns_host_scores_0_to_10(server: Server) -> None:
    status, body = server.post("/prioritize", {"Pod": gpu_pod("p2"),
                                               "NodeNames": ["n0", "n1", "ghost"]})
    assert status == 200
    assert isinstance(body, list)
    # the unknown node has no score: left out, 0 to kube-scheduler (it adds nothing for a
    # node the answer does not list)
    assert {h["Host"] for h in body} == {"n0", "n1"}
    assert all(isinstance(h["Score"], int) and 0 < h["Score"] <= 10 for h in body)


def test_spread_and_binpack_rank_nodes_oppositely() -> None:
    state = ready_state(NODES[:2])
    # n0 already half used.
    from elastic_gpu.core.request import pod_request_from_manifest

    token, assignment = state.reserve(pod_request_from_manifest(gpu_pod("busy")), "uid-busy", "n0")
    state.settle("uid-busy", token, "bound", with_binding(gpu_pod("busy"), "n0", assignment))
    ext = Extender(state)
    scores = {}
    for policy in ("binpack", "spread"):
        pod = pod_manifest("q", uid="uq", limits={"elasticgpu.io/gpu-core": "20"},
                           node_policy=policy)
        body = json.loads(ext.prioritize(json.dumps({"Pod": pod,
                                                      "NodeNames": ["n0", "n1"]}).encode()).text)
        scores[policy] = {"n0": 0, "n1": 0, **{h["Host"]: h["Score"] for h in body}}
    assert scores["binpack"]["n0"] > scores["binpack"]["n1"]
    assert scores["spread"]["n1"] > scores["spread"]["n0"]


def test_pod_errors_are_reported_in_error(server: Server) -> None:
    status, body = server.post("/filter", {"Pod": gpu_pod("bad", **{"tencent.com/vcuda-core": "150"}),
                                           "NodeNames": ["n0"]})
    assert status == 200
    assert "tencent.com/vcuda-core='150'" in body["Error"]
    assert "multiple of 100" in body["Error"]
    pod = pod_manifest("pol", limits={"nano-gpu/gpu-percent": "10"}, node_policy="fastest")
    status, body = server.post("/filter", {"Pod": pod, "NodeNames": ["n0"]})
    assert "elasticgpu.io/node-policy='fastest'" in body["Error"]


def test_absurd_request_fails_every_node_with_a_reason(server: Server) -> None:
    pod = gpu_pod("huge", **{"elasticgpu.io/gpu-core": "100000"})
    status, body = server.post("/filter", {"Pod": pod, "NodeNames": ["n0", "n1"]})
    assert status == 200 and body["Error"] == ""
    assert body["NodeNames"] == []
    assert all("1000" in reason for reason in body["FailedNodes"].values())


def test_bad_bodies_get_400_naming_the_problem(server: Server) -> None:
    for verb in ("filter", "prioritize", "bind", "preempt"):
        status, body = server.post(f"/{verb}", b"{oops")
        assert status == 400, verb
        assert "not JSON" in body["Error"]
    status, body = server.post("/bind", {"PodName": "p"})
    assert status == 400 and "PodNamespace" in body["Error"]


def test_bind_without_api_access_is_an_error_not_a_crash(server: Server) -> None:
    status, body = server.post("/bind", {"PodName": "p", "PodNamespace": "default",
                                         "PodUID": "u", "Node": "n0"})
    assert status == 200
    assert "no API access" in body["Error"]


def test_health_readiness_metrics() -> None:
    srv = Server(Extender(SchedulerState()))
    try:
        assert srv.get("/healthz") == (200, "ok")
        status, text = srv.get("/readyz")
        assert status == 503 and "not synced" in text
        status, body = srv.post("/filter", {"Pod": gpu_pod("x"), "NodeNames": ["n0"]})
        assert status == 503 and "not synced" in body["Error"]
        ready_state(NODES, srv.extender.state)
        assert srv.get("/readyz") == (200, "ok")
        srv.post("/filter", {"Pod": gpu_pod("x"), "NodeNames": ["n0"]})
        status, text = srv.get("/metrics")
        assert 'elasticgpu_scheduler_request_duration_seconds_count{verb="filter"}' in text
        labels = 'device_index="0",device_uuid="GPU-0-0",model="T4",node="n0"'
        assert f'elasticgpu_scheduler_card_compute_allocated_millicards{{{labels}}} 0.0' in text
        assert f'elasticgpu_scheduler_card_compute_capacity_millicards{{{labels}}} 1000.0' in text
        assert metric_value(text, f'elasticgpu_scheduler_card_memory_capacity_bytes{{{labels}}}'
                            ) == 16384 << 20
        assert f'elasticgpu_scheduler_card_healthy{{{labels}}} 1.0' in text
    finally:
        srv.stop()


def test_the_page_sent_in_pieces_has_its_length_and_a_head_request_no_body(
        server: Server) -> None:
    """/metrics is sent piece by piece (never joined in one copy): its Content-Length is the
    whole page's, and a HEAD request gets the headers alone, so the connection's next answer is
    read as that answer (a streamed body after a HEAD would be read as the next status line)."""
    conn = HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("HEAD", "/metrics")
    head = conn.getresponse()
    assert head.status == 200 and head.read() == b""
    conn.request("GET", "/healthz")
    health = conn.getresponse()
    assert (health.status, health.read()) == (200, b"ok")
    conn.request("GET", "/metrics")
    page = conn.getresponse()
    body = page.read()
    assert page.status == 200 and int(page.getheader("Content-Length") or -1) == len(body)
    assert body.count(b"elasticgpu_scheduler_card_healthy{") == sum(len(n.cards) for n in NODES)
    # the HEAD's length was the page's then (a page written later may differ: counters grew)
    assert int(head.getheader("Content-Length") or 0) > len(body) // 2
    conn.close()


def test_a_scrape_being_written_stalls_no_verb() -> None:
    """The page (series per card and per share: ~65 ms of writing at 1,000 nodes, ~1 s at
    15,000) is written in pieces with the verbs answered in between: here its writer, after
    the first piece, goes on pausing until a health check and a filter sent meanwhile have been
    answered; the scrape then gets its whole page. Written in one go, the health check would
    wait for the whole page (the writer gives up after 60 s and the scrape is done first)."""
    extender = Extender(ready_state(NODES, SchedulerState()))
    writing, answered = threading.Event(), threading.Event()
    gave_up: list[bool] = []
    families = extender.metrics.state_text

    def pausing() -> Iterator[bytes]:
        pieces = iter(families())
        yield next(pieces)
        writing.set()
        deadline = time.monotonic() + 60  # generous: a busy box is slow, never this slow
        while not answered.is_set() and time.monotonic() < deadline:
            time.sleep(0.001)
            yield b""  # a pause: the loop answers what came meanwhile
        gave_up.append(not answered.is_set())
        yield from pieces

    extender.metrics.state_text = pausing
    srv = Server(extender)
    pool = ThreadPoolExecutor(1)
    try:
        scrape = pool.submit(srv.get, "/metrics",
                             HTTPConnection("127.0.0.1", srv.port, timeout=120))
        assert writing.wait(60)
        other = HTTPConnection("127.0.0.1", srv.port, timeout=90)
        assert srv.get("/healthz", other) == (200, "ok")
        status, body = srv.post("/filter", {"Pod": gpu_pod("during-scrape"),
                                            "NodeNames": ["n0", "n1"]}, other)
        assert status == 200 and body["NodeNames"] and not body["Error"]
        assert not scrape.done()
        answered.set()
        status, text = scrape.result(120)
        assert gave_up == [False]  # it paused until both were answered
        labels = 'device_index="1",device_uuid="GPU-3-1",model="A100",node="n3"'
        assert status == 200
        assert f"elasticgpu_scheduler_card_healthy{{{labels}}} 1.0" in text
        assert 'elasticgpu_scheduler_node_requested_cpu_cores{node="n3"}' in text
        assert "# TYPE elasticgpu_scheduler_request_duration_seconds histogram" in text
    finally:
        answered.set()
        pool.shutdown()
        srv.stop()


def test_requests_are_counted_by_verb_and_outcome_and_refusals_by_reason() -> None:
    srv = Server(Extender(ready_state(NODES)))
    try:
        srv.post("/filter", {"Pod": gpu_pod("fits"), "NodeNames": ["n0", "n1"]})
        srv.post("/filter", {"Pod": gpu_pod("big", **{"elasticgpu.io/gpu-memory": "99999"}),
                             "NodeNames": ["n0", "n1"]})
        picky = pod_manifest("picky", uid="uid-picky", limits={"elasticgpu.io/gpu-core": "30"},
                             annotations={"elasticgpu.io/gpu-model": "H100"})
        srv.post("/filter", {"Pod": picky, "NodeNames": ["n0", "n1"]})
        srv.post("/filter", b"{not json")
        text = srv.get("/metrics")[1]
        count = 'elasticgpu_scheduler_requests_total{{outcome="{}",verb="filter"}} {}'
        assert count.format("feasible", "1.0") in text
        assert count.format("unschedulable", "2.0") in text
        assert count.format("bad_request", "1.0") in text
        assert 'elasticgpu_scheduler_unschedulable_total{reason="gpu"} 1.0' in text
        assert 'elasticgpu_scheduler_unschedulable_total{reason="model"} 1.0' in text
    finally:
        srv.stop()


# ---- fuzz ------------------------------------------------------------------------------------

GPU_NAMES = [spec.name for spec in RESOURCE_TABLE] + ["nvidia.com/mig-1g.10gb", "cpu"]
quantities = st.one_of(
    st.integers(-10, 10**6).map(str), st.integers(-5, 300),
    st.sampled_from(["1.5", "0.5", "1e30", "abc", "", "100Mi", "1k", "-0", "NaN"]),
    st.floats(allow_nan=True), st.booleans(), st.none())
limits = st.dictionaries(st.sampled_from(GPU_NAMES), quantities, max_size=4)
containers = st.dictionaries(st.text(min_size=1, max_size=5), limits, min_size=0, max_size=3)
annotation_values = st.one_of(st.sampled_from(["binpack", "spread", "A100", "T4", "x|y"]),
                              st.text(max_size=8))
pods = st.builds(
    lambda c, notes, uid: {**pod_manifest("f", uid=uid, containers=c or {"main": {}}),
                           "metadata": {"name": "f", "uid": uid, "annotations": notes}},
    containers,
    st.dictionaries(st.sampled_from(["elasticgpu.io/node-policy", "elasticgpu.io/card-policy",
                                     "elasticgpu.io/gpu-model", "elasticgpu.io/gpu-model-deny",
                                     "elasticgpu.io/assignment"]), annotation_values),
    st.sampled_from(["u-f", "", "uid-busy"]))
junk = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
node_names = st.lists(st.sampled_from(["n0", "n1", "n2", "n3", "ghost", ""]), max_size=6)
bodies = st.one_of(
    st.binary(max_size=64),
    junk.map(lambda j: json.dumps(j).encode()),
    st.fixed_dictionaries({"Pod": pods | junk, "NodeNames": node_names | junk},
                          optional={"Nodes": junk}).map(lambda d: json.dumps(d).encode()),
    st.fixed_dictionaries({"Pod": pods, "NodeNameToMetaVictims": st.dictionaries(
        st.sampled_from(["n0", "n1", "ghost"]),
        st.none() | st.fixed_dictionaries({"Pods": st.lists(st.fixed_dictionaries(
            {"UID": st.text(max_size=4)}), max_size=2)}))}).map(
        lambda d: json.dumps(d).encode()),
    st.fixed_dictionaries({"PodName": st.text(max_size=3), "PodNamespace": st.text(max_size=3),
                           "PodUID": st.text(max_size=3), "Node": st.text(max_size=3)}).map(
        lambda d: json.dumps(d).encode()),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(verb=st.sampled_from(["filter", "prioritize", "bind", "preempt"]), body=bodies)
def test_fuzz_never_500_and_always_well_formed(server: Server, verb: str, body: bytes) -> None:
    status, answer = server.post(f"/{verb}", body)
    assert status in (200, 400, 422), (status, answer)
    if status != 200:
        assert answer["Error"]
        return
    if verb == "filter":
        if answer["Error"]:
            return
        sent = json.loads(body)
        # answered in the form asked: names (nodeCacheCapable) or Node objects
        if sent["NodeNames"] is not None or sent.get("Nodes") is None:
            asked, feasible = sent["NodeNames"] or [], answer["NodeNames"]
        else:
            asked = [n["metadata"]["name"] for n in sent["Nodes"].get("items") or []]
            feasible = [n["metadata"]["name"] for n in answer["Nodes"]["items"]]
        placed = set(feasible) | set(answer["FailedNodes"]) | set(
            answer["FailedAndUnresolvableNodes"])
        assert placed == set(asked)
        for reason in {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}.values():
            assert reason
    elif verb == "prioritize":
        assert all(0 <= h["Score"] <= 10 for h in answer)
    elif verb == "preempt":
        asked = json.loads(body).get("NodeNameToMetaVictims") or {}
        assert set(answer["NodeNameToMetaVictims"]) <= set(asked)
    else:
        assert isinstance(answer["Error"], str)


def test_https_when_given_a_certificate(tmp_path: Any) -> None:
    import datetime
    import ipaddress
    from http.client import HTTPSConnection

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from elastic_gpu.scheduler.app import ServeOptions, tls_context

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "egpu-scheduler")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(
                ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    assert tls_context(ServeOptions()) is None
    srv = Server(Extender(ready_state(NODES)),
                 tls_context(ServeOptions(tls_cert=cert_path, tls_key=key_path)))
    try:
        client_ctx = ssl.create_default_context(cafile=str(cert_path))
        srv.conn = HTTPSConnection("127.0.0.1", srv.port, timeout=10, context=client_ctx)
        status, body = srv.post("/filter", {"Pod": gpu_pod("tls"), "NodeNames": ["n0"]})
        assert status == 200 and body["NodeNames"] == ["n0"]
    finally:
        srv.stop()
