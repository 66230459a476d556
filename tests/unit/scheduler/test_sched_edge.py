"""The extender's HTTP edge: what one request may cost, what bind refuses, the bounded
recent-pods cache, the last-resort handler, and the SIGTERM drain."""

from __future__ import annotations

import asyncio
import copy
import json
import socket
import threading
from collections.abc import Iterator, Mapping
from http.client import HTTPConnection
from typing import Any

import pytest

from egpu_testing.workbench import ServedExtender as Server
from egpu_testing.workbench import pod_manifest, ready_state
from elastic_gpu.core.model import Card, Node
from elastic_gpu.core.nodeaffinity import Taint
from elastic_gpu.scheduler import handle as handle_module
from elastic_gpu.scheduler.app import ServeOptions, serve_extender
from elastic_gpu.scheduler.config import SchedulerConfig
from elastic_gpu.scheduler.extender import Extender
from elastic_gpu.scheduler.state import NodeInfo, SchedulerState
from elastic_gpu.scheduler.verbs import RECENT_BYTES

NODES = [Node(f"n{i}", 64_000, 256_000, (Card(0, f"GPU-{i}", "A100", 16384),),
              {"zone": "a" if i < 2 else "b", "kubernetes.io/hostname": f"n{i}"})
         for i in range(4)]


class FakeApi:
    """PodApi: records Bindings; `gate` (when set) holds every bind until released."""

    def __init__(self) -> None:
        self.bound: list[tuple[str, str, str]] = []
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   resource_version: int | None, annotations: Mapping[str, str]) -> None:
        self.entered.set()
        if self.gate is not None:
            while not self.gate.is_set():
                await asyncio.sleep(0.01)
        self.bound.append((f"{namespace}/{name}", node, annotations.get(
            "elasticgpu.io/assigned-node", "")))


def _state(config: SchedulerConfig | None = None) -> SchedulerState:
    state = ready_state(NODES, SchedulerState(config))
    info = NodeInfo("n3", 64_000, 256_000, dict(NODES[3].labels),
                    taints=(Taint("dedicated", "ml", "NoSchedule"),))
    state.upsert_node(info)
    return state


@pytest.fixture
def edge() -> Iterator[tuple[Server, FakeApi]]:
    api = FakeApi()
    srv = Server(Extender(_state(), api))
    yield srv, api
    srv.stop()


def bind_body(pod: Mapping[str, Any], node: str) -> dict[str, str]:
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
            "Node": node}


def _pending(srv: Server, name: str, **spec: Any) -> dict[str, Any]:
    pod = pod_manifest(name, uid=f"uid-{name}", limits={"elasticgpu.io/gpu-core": "30"})
    pod["metadata"]["resourceVersion"] = "5"
    pod["spec"].update(spec)
    srv.extender.state.observe_pod(pod)  # as the pod watch delivers it
    return pod


# ---- bind refuses what kube-scheduler's filters would --------------------------------------


def test_bind_refuses_a_node_the_node_selector_excludes(edge: tuple[Server, FakeApi]) -> None:
    srv, api = edge
    pod = _pending(srv, "sel", nodeSelector={"zone": "a"})
    status, answer = srv.post("/bind", bind_body(pod, "n2"))
    assert status == 200
    assert answer["Error"] == ("bind default/sel to n2: the node does not match the pod's node "
                               "selector or required node affinity")
    assert api.bound == []
    assert srv.post("/bind", bind_body(pod, "n1")) == (200, {"Error": ""})
    assert api.bound == [("default/sel", "n1", "n1")]


def test_bind_refuses_required_affinity_and_taints(edge: tuple[Server, FakeApi]) -> None:
    srv, api = edge
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "zone", "operator": "NotIn", "values": ["a"]}]}]}}}
    pod = _pending(srv, "aff", affinity=affinity)
    assert "node selector or required node affinity" in srv.post(
        "/bind", bind_body(pod, "n0"))[1]["Error"]
    _, answer = srv.post("/bind", bind_body(pod, "n3"))
    assert answer["Error"] == ("bind default/aff to n3: the node has a taint the pod does not "
                               "tolerate (dedicated=ml:NoSchedule)")
    assert api.bound == []
    assert srv.post("/bind", bind_body(pod, "n2")) == (200, {"Error": ""})
    tolerant = _pending(srv, "tol", tolerations=[{"key": "dedicated", "operator": "Exists"}])
    assert srv.post("/bind", bind_body(tolerant, "n3")) == (200, {"Error": ""})
    assert [b[1] for b in api.bound] == ["n2", "n3"]


def test_bind_refuses_non_gpu_pods_and_unknown_nodes(edge: tuple[Server, FakeApi]) -> None:
    srv, api = edge
    plain = pod_manifest("plain", uid="uid-plain")
    plain["metadata"]["resourceVersion"] = "3"
    srv.extender.state.observe_pod(plain)
    _, answer = srv.post("/bind", bind_body(plain, "n0"))
    assert "the pod asks for no GPU resource" in answer["Error"]
    pod = _pending(srv, "ghostly")
    _, answer = srv.post("/bind", bind_body(pod, "ghost"))
    assert answer["Error"] == "bind default/ghostly to ghost: node ghost is unknown to the GPU " \
                              "scheduler"
    assert api.bound == []


def test_bind_checks_the_pod_filter_saw_when_the_watch_lags(edge: tuple[Server, FakeApi]) -> None:
    srv, api = edge
    pod = pod_manifest("late", uid="uid-late", limits={"elasticgpu.io/gpu-core": "30"})
    pod["metadata"]["resourceVersion"] = "9"
    pod["spec"]["nodeSelector"] = {"zone": "b"}
    assert srv.post("/filter", {"Pod": pod, "NodeNames": ["n0", "n2"]})[0] == 200
    assert "node selector" in srv.post("/bind", bind_body(pod, "n0"))[1]["Error"]
    assert srv.post("/bind", bind_body(pod, "n2")) == (200, {"Error": ""})
    assert api.bound == [("default/late", "n2", "n2")]


# ---- the recent-pods cache is slim and bounded in bytes ---------------------------------------


def test_recent_pods_keep_only_what_bind_needs_within_a_byte_bound() -> None:
    ext = Extender(_state())
    big = {f"team.example.com/note-{i}": "x" * 200_000 for i in range(10)}  # ~2 MiB per pod
    for i in range(40):
        pod = pod_manifest(f"p{i}", uid=f"u{i}", annotations={**big, "elasticgpu.io/gpu-model":
                                                               "A100"},
                           limits={"elasticgpu.io/gpu-core": "10"})
        pod["metadata"]["resourceVersion"] = "1"
        ext.filter(json.dumps({"Pod": pod, "NodeNames": ["n0"]}).encode())
    kept, size = ext.verbs.recent.get("u39"), ext.verbs.recent.size("u39")
    assert kept is not None and size is not None
    assert kept["metadata"]["annotations"] == {"elasticgpu.io/gpu-model": "A100"}
    assert size < 1024 and ext.verbs.recent.bytes < 40 * 1024  # not 80 MiB
    # pods whose own GPU annotations are large: evicted oldest first to stay under the bound
    gpu_note = {"elasticgpu.io/gpu-model": "A" * 200_000}
    for i in range(100):
        pod = pod_manifest(f"q{i}", uid=f"q{i}", annotations=gpu_note,
                           limits={"elasticgpu.io/gpu-core": "10"})
        ext.filter(json.dumps({"Pod": pod, "NodeNames": ["n0"]}).encode())
    assert ext.verbs.recent.bytes <= RECENT_BYTES
    assert "q99" in ext.verbs.recent and "q0" not in ext.verbs.recent
    assert ext.verbs.recent.bytes == sum(ext.verbs.recent.sizes)


# ---- HTTP limits -------------------------------------------------------------------------------


def _raw(port: int, head: bytes, body: bytes = b"") -> tuple[int, dict[str, Any]]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < int(
                data.split(b"Content-Length: ", 1)[1].split(b"\r\n", 1)[0]
                if b"Content-Length: " in data else 0):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head_part, _, payload = data.partition(b"\r\n\r\n")
    return int(head_part.split(b" ", 2)[1]), json.loads(payload)


def test_a_body_over_the_limit_is_refused_before_it_is_read(edge: tuple[Server, FakeApi]) -> None:
    srv, _ = edge
    # Content-Length announces 58 MiB; nothing of it is sent, the answer comes anyway
    status, answer = _raw(srv.port, b"POST /filter HTTP/1.1\r\nHost: x\r\n"
                                    b"Content-Length: 60817408\r\n\r\n")
    assert status == 413
    assert answer["Error"].startswith("request body of 60817408 bytes is over the limit of "
                                      "16777216 bytes (maxRequestBytes")
    status, answer = _raw(srv.port, b"POST /bind HTTP/1.1\r\nHost: x\r\n"
                                    b"Content-Length: 100000\r\n\r\n")
    assert status == 413 and "a bind's body is four names" in answer["Error"]


def test_a_chunked_body_is_cut_off_at_the_limit() -> None:
    api = FakeApi()
    srv = Server(Extender(_state(SchedulerConfig(maxRequestBytes=64 * 1024)), api))
    try:
        chunk = b"x" * 40_000
        body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(3)) + b"0\r\n\r\n"
        status, answer = _raw(srv.port, b"POST /filter HTTP/1.1\r\nHost: x\r\n"
                                        b"Transfer-Encoding: chunked\r\n\r\n", body)
        assert status == 413 and "over the limit of 65536 bytes" in answer["Error"]
        assert "the rest was not read" in answer["Error"]
    finally:
        srv.stop()


def test_too_many_large_requests_at_once_get_429(edge: tuple[Server, FakeApi],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    srv, _ = edge
    srv.extender.routes.heavy_waiting = handle_module.HEAVY_SLOTS + handle_module.HEAVY_QUEUE
    body = json.dumps({"Pod": {}, "NodeNames": ["n0"], "pad": "x" * 300_000}).encode()
    status, answer = srv.post("/filter", body)
    assert status == 429 and "large requests are in progress" in answer["Error"]
    srv.extender.routes.heavy_waiting = 0
    status, answer = srv.post("/filter", body)  # the same body, handled in a worker thread
    assert status == 200 and answer["NodeNames"] == ["n0"]


def test_an_unexpected_error_is_logged_and_answered_500_and_serving_goes_on(
        edge: tuple[Server, FakeApi], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    srv, _ = edge

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(srv.extender.state, "filter", broken)
    pod = pod_manifest("b", uid="u-b", limits={"elasticgpu.io/gpu-core": "30"})
    status, answer = srv.post("/filter", {"Pod": pod, "NodeNames": ["n0"]})
    assert status == 500 and "RuntimeError" in answer["Error"]
    assert "filter: unexpected error" in caplog.text
    monkeypatch.undo()
    assert srv.post("/filter", {"Pod": pod, "NodeNames": ["n0"]})[0] == 200


# ---- SIGTERM: stop accepting, finish binds, return ----------------------------------------------


def test_drain_finishes_binds_in_flight_and_refuses_new_connections() -> None:
    api = FakeApi()
    api.gate = threading.Event()
    extender = Extender(_state(), api)
    pod = pod_manifest("d", uid="uid-d", limits={"elasticgpu.io/gpu-core": "30"})
    pod["metadata"]["resourceVersion"] = "2"
    extender.state.observe_pod(pod)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    started = threading.Event()
    outcome: list[BaseException | None] = []

    async def main() -> None:
        ready = asyncio.Event()
        task = asyncio.ensure_future(serve_extender(
            extender, ServeOptions(port=port, drain_s=10), stop, ready))
        await ready.wait()
        started.set()
        await task

    def run() -> None:
        try:
            loop.run_until_complete(main())
            outcome.append(None)
        except BaseException as err:  # reported by the assertion below
            outcome.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(10)
    answers: list[tuple[int, Any]] = []

    def bind() -> None:
        conn = HTTPConnection("127.0.0.1", port, timeout=20)
        conn.request("POST", "/bind", body=json.dumps(bind_body(pod, "n0")))
        response = conn.getresponse()
        answers.append((response.status, json.loads(response.read())))

    binder = threading.Thread(target=bind)
    binder.start()
    assert api.entered.wait(10)  # the bind is writing its Binding
    loop.call_soon_threadsafe(stop.set)  # what SIGTERM does
    for _ in range(100):  # the listener closes while the bind is still held
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            break
        threading.Event().wait(0.05)
    else:
        pytest.fail("still accepting connections after the stop")
    assert thread.is_alive() and not answers  # still draining
    api.gate.set()
    binder.join(10)
    thread.join(10)
    assert answers == [(200, {"Error": ""})]
    assert api.bound == [("default/d", "n0", "n0")]
    assert outcome == [None]
    loop.close()


def test_the_tls_deploy_example_is_the_generated_config() -> None:
    from pathlib import Path

    import yaml

    from elastic_gpu.scheduler.schedconfig import TLS_FILES, kube_scheduler_config

    path = Path(__file__).parents[3] / "deploy/scheduler/kube-scheduler-config-tls.yaml"
    deployed = yaml.safe_load(path.read_text())
    assert deployed == kube_scheduler_config("https://127.0.0.1:8888", tls_config=TLS_FILES)
    (extender,) = deployed["extenders"]
    assert extender["enableHTTPS"] is True and set(extender["tlsConfig"]) == {
        "certFile", "keyFile", "caFile"}


def test_tls_context_requires_client_certificates_when_given_a_ca(tmp_path: Any) -> None:
    import ssl

    from egpu_testing.workbench import TestPki
    from elastic_gpu.scheduler.app import TLSFilesError, tls_context

    pki = TestPki.create(tmp_path)
    plain = tls_context(ServeOptions(tls_cert=pki.server_cert, tls_key=pki.server_key))
    assert plain is not None and plain.verify_mode == ssl.CERT_NONE
    mutual = tls_context(ServeOptions(tls_cert=pki.server_cert, tls_key=pki.server_key,
                                      tls_client_ca=pki.ca))
    assert mutual is not None and mutual.verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(TLSFilesError, match="--tls-client-ca"):
        tls_context(ServeOptions(tls_cert=pki.server_cert, tls_key=pki.server_key,
                                 tls_client_ca=tmp_path / "missing.crt"))
    with pytest.raises(TLSFilesError, match="--tls-cert"):
        tls_context(ServeOptions(tls_cert=pki.ca, tls_key=pki.server_key))
    srv = Server(Extender(_state()), mutual)
    try:
        from http.client import HTTPSConnection

        with pytest.raises((ssl.SSLError, ConnectionError)):
            conn = HTTPSConnection("127.0.0.1", srv.port, timeout=10,
                                   context=pki.client_context(cert=False))
            srv.get("/healthz", conn)
        conn = HTTPSConnection("127.0.0.1", srv.port, timeout=10, context=pki.client_context())
        assert srv.get("/healthz", conn) == (200, "ok")
    finally:
        srv.stop()


def test_the_cli_listens_on_loopback_by_default_and_checks_tls_options() -> None:
    from typer.testing import CliRunner

    from elastic_gpu.cli.main import app

    text = " ".join(CliRunner().invoke(app, ["scheduler", "--help"],
                                       env={"COLUMNS": "300"}).output.split())
    assert "loopback (127.0.0.1) by default" in text and "--tls-client-ca" in text
    assert SchedulerConfig().host == "127.0.0.1"
    result = CliRunner().invoke(app, ["scheduler", "--tls-client-ca", "ca.crt"])
    assert result.exit_code == 2
    assert "tls (set by --tls-client-ca)" in result.output
    assert "clientCAFile needs certFile and keyFile (HTTPS)" in result.output


def test_slim_objects_keep_what_the_placement_check_reads() -> None:
    from elastic_gpu.core.nodeaffinity import rules_from_manifest, taints_from_node
    from elastic_gpu.scheduler.app import node_info
    from elastic_gpu.scheduler.slim import slim_node, slim_pod

    pod = pod_manifest("s", uid="u", limits={"elasticgpu.io/gpu-core": "30"})
    pod["spec"].update({
        "nodeSelector": {"zone": "a"},
        "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"x": 1}, "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}],
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In",
                                  "values": ["n1"]}]}]}}}})
    slim = slim_pod(pod)
    assert rules_from_manifest(slim) == rules_from_manifest(pod)
    assert rules_from_manifest(slim).required_terms
    assert "podAntiAffinity" not in slim["spec"]["affinity"]
    node = {"metadata": {"name": "n1", "labels": {"zone": "a"}},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}], "podCIDR": "x"},
            "status": {"allocatable": {"cpu": "4"}}}
    assert taints_from_node(slim_node(node)) == taints_from_node(node) == (
        Taint("k", "", "NoSchedule"),)
    assert node_info(slim_node(node)).taints == (Taint("k", "", "NoSchedule"),)


def test_pods_with_huge_annotations_leave_no_memory_behind() -> None:
    import gc
    import tracemalloc

    ext = Extender(_state())
    bodies = []
    for i in range(10):  # the shape, within the API's 3 MiB per object
        pod = pod_manifest(f"h{i}", uid=f"h{i}", limits={"elasticgpu.io/gpu-core": "10"},
                           annotations={f"team.example.com/blob-{j}": "x" * 250_000
                                        for j in range(10)})
        pod["metadata"]["resourceVersion"] = "1"
        bodies.append(json.dumps({"Pod": pod, "NodeNames": ["n0", "n1"]}).encode())
    ext.filter(bodies[0])  # warm caches
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for body in bodies[1:]:
            ext.filter(body)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 256 * 1024, kept  # 9 pods of 2.5 MiB each: none of it kept


def test_a_forged_filter_cannot_change_what_bind_reserves(edge: tuple[Server, FakeApi]) -> None:
    srv, api = edge
    pod = _pending(srv, "real")  # 30% of a card, as the pod watch has it
    forged = copy.deepcopy(pod)
    forged["spec"]["containers"][0]["resources"] = {"limits": {"elasticgpu.io/gpu-core": "1"}}
    srv.post("/filter", {"Pod": forged, "NodeNames": ["n0"]})  # same uid and version, 1%
    assert srv.post("/bind", bind_body(pod, "n0")) == (200, {"Error": ""})
    held = srv.extender.state.holds()["uid-real"]
    assert [s.milli for shares in held.containers.values() for s in shares] == [300]
    assert api.bound == [("default/real", "n0", "n0")]
