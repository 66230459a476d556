"""Pods and inventories for exercising the extender: tests, benchmarks and the sandbox.

Pod manifests in every request style users bring (ours, gpu-manager's, nano-gpu's, whole
cards, MIG), and the state fed directly from core `Node`s, as the reflectors would feed it.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from egpu_testing.process import SupervisedProcess
from elastic_gpu.api.gpudevice import object_name
from elastic_gpu.core import annotations as ann
from elastic_gpu.core.assignment import Assignment
from elastic_gpu.core.model import Node
from elastic_gpu.scheduler.schedconfig import kube_scheduler_config
from elastic_gpu.scheduler.state import NodeInfo, SchedulerState

#: One example per request style: name -> container resources (limits).
STYLES: Mapping[str, Mapping[str, str]] = {
    "canonical": {"elasticgpu.io/gpu-core": "30", "elasticgpu.io/gpu-memory": "8192"},
    "vcuda": {"tencent.com/vcuda-core": "40", "tencent.com/vcuda-memory": "16"},
    "nano": {"nano-gpu/gpu-percent": "25"},
    "whole": {"nvidia.com/gpu": "2"},
    "canonical-whole": {"elasticgpu.io/gpu-core": "100"},
    "mig": {"nvidia.com/mig-3g.40gb": "1"},
}


def pod_manifest(name: str, namespace: str = "default", *,
                 containers: Mapping[str, Mapping[str, str]] | None = None,
                 limits: Mapping[str, str] | None = None,
                 annotations: Mapping[str, str] | None = None, uid: str | None = None,
                 scheduler_name: str | None = None, priority: int | None = None,
                 node_policy: str | None = None, card_policy: str | None = None
                 ) -> dict[str, Any]:
    """A pod; `containers` maps container name -> GPU limits (or `limits` for one container)."""
    if containers is None:
        containers = {"main": dict(limits or {})}
    notes = dict(annotations or {})
    if node_policy:
        notes[ann.NODE_POLICY] = node_policy
    if card_policy:
        notes[ann.CARD_POLICY] = card_policy
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if notes:
        meta["annotations"] = notes
    if uid is not None:
        meta["uid"] = uid
    spec: dict[str, Any] = {
        "containers": [{"name": cname, "image": "busybox",
                        "resources": {"limits": dict(res), "requests": dict(res)}}
                       for cname, res in containers.items()],
    }
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    if priority is not None:
        spec["priority"] = priority
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def feed_nodes(state: SchedulerState, nodes: Iterable[Node]) -> None:
    """Put inventory into the state the way the node and GPUDevice reflectors do."""
    node_list = list(nodes)
    state.replace_nodes(NodeInfo(n.name, n.cpu_milli, n.memory_mib, dict(n.labels))
                        for n in node_list)
    state.replace_devices((object_name(n.name, c.index), n.name, c)
                          for n in node_list for c in n.cards)


def ready_state(nodes: Iterable[Node], state: SchedulerState | None = None,
                pods: Iterable[Mapping[str, Any]] = ()) -> SchedulerState:
    state = state or SchedulerState()
    feed_nodes(state, nodes)
    state.replace_pods(pods)
    for source in sorted(state.required_sources):
        state.mark_synced(source)
    return state


# ---- against a real control plane -------------------------------------------------------------


class ExtenderProcess(SupervisedProcess):
    """`egpu scheduler` as a subprocess (so a test can SIGKILL it like a crashed pod)."""

    what = "egpu scheduler"
    stop_signal = signal.SIGINT

    def __init__(self, kubeconfig: Path, port: int, log_path: Path,
                 config: Mapping[str, Any] | None = None,
                 python_args: Sequence[str] = (), tls: TestPki | None = None,
                 scheduler_name: str | None = None, args: Sequence[str] = ()) -> None:
        super().__init__(log_path)
        #: more `egpu scheduler` options (e.g. --identity)
        self.args = tuple(args)
        #: a replica that stands by (leaderElection: another holds the Lease) counts as
        #: started once its caches are synced (`start(standby=True)`)
        self.standby_ok = False
        #: e.g. ("-m", "cProfile", "-o", "out.prof") to profile the extender
        self.python_args = tuple(python_args)
        #: serve HTTPS with mutual TLS (`TestPki`): --tls-cert/--tls-key/--tls-client-ca
        self.tls = tls
        self.kubeconfig = kubeconfig
        self.port = port
        #: the profile of the test's kube-scheduler that calls this extender (its
        #: `schedulerNames`; the control plane is shared, so each test has its own name): give
        #: it to `extender_kube_scheduler_config` and to the test's pods
        self.scheduler_name = scheduler_name or f"egpu-{uuid.uuid4().hex[:8]}"
        settings = {"schedulerNames": [self.scheduler_name], **dict(config or {})}
        self.config_path: Path | None = log_path.with_suffix(".config.yaml")
        self.config_path.write_text(yaml.safe_dump(settings))
        self.starts = 0

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0, standby: bool = False) -> None:
        self.standby_ok = standby
        egpu = Path(sys.executable).with_name("egpu")
        prefix = [sys.executable, *self.python_args, str(egpu)] if self.python_args else [str(egpu)]
        argv = [*prefix, "scheduler", "--kubeconfig", str(self.kubeconfig), "--host",
                "127.0.0.1", "--port", str(self.port)]
        if self.config_path is not None:
            argv += ["--config", str(self.config_path)]
        if self.tls is not None:
            argv += ["--tls-cert", str(self.tls.server_cert), "--tls-key",
                     str(self.tls.server_key), "--tls-client-ca", str(self.tls.ca)]
        argv += self.args
        self.starts += 1
        self.launch(argv, timeout_s, header=f"---- start {self.starts}: {' '.join(argv)}\n")

    def ready(self) -> bool:
        status, text = self.readyz()
        return status == 200 or (self.standby_ok and status == 503
                                 and "standing by" in text and "caches synced" in text)

    def readyz(self) -> tuple[int, str]:
        """(status, body) of /readyz; (0, why) when it does not answer."""
        try:
            context = self.tls.client_context() if self.tls is not None else None
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=2,
                                        context=context) as response:
                return int(response.status), response.read().decode(errors="replace")
        except urllib.error.HTTPError as err:
            return int(err.code), err.read().decode(errors="replace")
        except OSError as err:
            return 0, str(err)


def extender_kube_scheduler_config(url: str, scheduler_name: str,
                                   qps: int = 500, prioritize: bool = True) -> dict[str, Any]:
    """The deploy/ configuration pointed at `url`, for a kube-scheduler of its own name
    (`prioritize=False`: the one for an extender with `filterResult: best`)."""
    config = kube_scheduler_config(url, scheduler_name=scheduler_name, prioritize=prioritize,
                                   peer_schedulers=())
    config["clientConnection"] = {"qps": qps, "burst": qps}
    return config


def plain_kube_scheduler_config(scheduler_name: str, qps: int = 500) -> dict[str, Any]:
    return {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "profiles": [{"schedulerName": scheduler_name}],
            "clientConnection": {"qps": qps, "burst": qps}}


@contextmanager
def running_extender(cluster: Any, log_dir: Path, *, config: Mapping[str, Any] | None = None,
                     start_timeout_s: float = 60.0,
                     kube_scheduler: Callable[[dict[str, Any]], Any] | None = None
                     ) -> Iterator[ExtenderProcess]:
    """An extender on a free port of the test control plane `cluster`, ready (the GPUDevice CRD
    is installed first: the extender is ready once its watch is), stopped on exit; given the
    `start_kube_scheduler` fixture, also a kube-scheduler of its own name calling it."""
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd
    from elastic_gpu.devcluster.ports import free_ports

    ensure_crd(cluster.kube())
    (port,) = free_ports(1)
    process = ExtenderProcess(cluster.kubeconfig, port, log_dir / "extender.log", config=config)
    process.start(timeout_s=start_timeout_s)
    try:
        if kube_scheduler is not None:
            kube_scheduler(extender_kube_scheduler_config(process.url, process.scheduler_name))
        yield process
    finally:
        process.stop()


@dataclass(frozen=True)
class CardUse:
    milli: int = 0
    memory_mib: int = 0
    pods: tuple[str, ...] = ()


def card_use_from_pods(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], CardUse]:
    """What the pods' assignment annotations say each card carries: an independent reading
    (straight from the API's pod objects, none of the scheduler's code but the decoder)."""
    use: dict[tuple[str, int], CardUse] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase")
        text = (meta.get("annotations") or {}).get(ann.ASSIGNMENT)
        if not text or phase in ("Succeeded", "Failed"):
            continue
        assignment = Assignment.from_json(text)
        for share in assignment.shares():
            key = (assignment.node, share.index)
            old = use.get(key, CardUse())
            use[key] = CardUse(old.milli + share.milli, old.memory_mib + share.memory_mib,
                               (*old.pods, f"{meta.get('namespace')}/{meta.get('name')}"))
    return use


def overcommitted(use: Mapping[tuple[str, int], CardUse], nodes: Iterable[Node]
                  ) -> list[str]:
    """Cards carrying more than 100% compute or more memory than they have."""
    cards = {(n.name, c.index): c for n in nodes for c in n.cards}
    problems = []
    for key, u in sorted(use.items()):
        card = cards.get(key)
        if card is None:
            problems.append(f"{key[0]} card {key[1]} does not exist but carries {u.pods}")
        elif u.milli > card.compute_milli or u.memory_mib > card.memory_mib:
            problems.append(f"{key[0]} card {key[1]}: {u.milli} milli / {u.memory_mib} MiB "
                            f"of {card.compute_milli} / {card.memory_mib} by {u.pods}")
    return problems


def mig_overheld(pods: Iterable[Mapping[str, Any]], nodes: Iterable[Node]) -> list[str]:
    """MIG instances two live pods' assignment annotations both name, or that the named card
    does not carry: an independent reading, as `card_use_from_pods`."""
    carved = {(n.name, c.index, m.uuid) for n in nodes for c in n.cards for m in c.mig}
    holders: dict[tuple[str, int, str], list[str]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(ann.ASSIGNMENT)
        if not text or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        assignment = Assignment.from_json(text)
        for share in assignment.shares():
            if share.mig_uuid is not None:
                holders.setdefault((assignment.node, share.index, share.mig_uuid), []).append(
                    f"{meta.get('namespace')}/{meta.get('name')}")
    problems = []
    for key, who in sorted(holders.items()):
        if key not in carved:
            problems.append(f"{key[0]} card {key[1]} has no MIG instance {key[2]}, held by {who}")
        elif len(who) > 1:
            problems.append(f"{key[0]} card {key[1]} MIG instance {key[2]} held by {who}")
    return problems


def share_fits_somewhere(milli: int, memory_mib: int, use: Mapping[tuple[str, int], CardUse],
                         nodes: Iterable[Node]) -> bool:
    for node in nodes:
        for card in node.cards:
            u = use.get((node.name, card.index), CardUse())
            if (card.compute_milli - u.milli >= milli
                    and card.memory_mib - u.memory_mib >= memory_mib):
                return True
    return False


def start_gpu_cluster(work_dir: Path, nodes: int, prefix: str) -> tuple[Any, Any, list[Node]]:
    """A control plane with kwok and `nodes` fake 8-card nodes but no kube-scheduler (each
    benchmark starts the scheduler it measures). Returns (plane, lightkube client, inventories); the caller
    stops the plane, which is stopped here already if registration fails."""
    from egpu_testing.cluster import TestCluster
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd
    from elastic_gpu.devcluster.nodes import register_fake_nodes, uniform_inventories

    plane = TestCluster(work_dir=work_dir / "k8s", die_with_parent=True)
    plane.start(scheduler=False, kwok_enabled=True)
    try:
        client = plane.client()
        ensure_crd(plane.kube())
        t0 = time.monotonic()
        inventories = uniform_inventories(nodes, prefix=prefix, gpus=8)
        register_fake_nodes(plane.kube(), inventories, new=True)  # a new cluster: no reads
        print(f"registered {nodes} nodes in {time.monotonic() - t0:.1f} s", flush=True)
    except BaseException:
        plane.stop()
        raise
    return plane, client, inventories


# ---- the extender's HTTP app in-process, and certificates for TLS tests ------------------------


class ServedExtender:
    """An `Extender` on a loopback port, served by a background thread as `egpu scheduler`
    serves it (a real server and event loop, the connection gate and its protocol servers);
    the test talks HTTP to it from its own thread."""

    def __init__(self, extender: Any, tls: Any = None) -> None:
        import asyncio
        import threading
        from http.client import HTTPConnection

        from aiohttp import web

        self.extender = extender
        self.loop = asyncio.new_event_loop()
        self.port = 0
        started = threading.Event()

        from elastic_gpu.runtime.http_connections import ConnectionGate, GatedSite, gated_app

        #: the connections, held and served as `egpu scheduler` does (its config's limits, its
        #: own HTTP/1.1 server); HTTP/2 where a TLS client negotiates it (`tls` must offer it,
        #: as `scheduler.app.tls_context`)
        self.gate = ConnectionGate(extender.state.config.connection_limits)
        self.gate.app = extender.http_app()

        async def start() -> None:
            self.runner = web.AppRunner(gated_app(extender.app(), self.gate))
            await self.runner.setup()
            site = GatedSite(self.runner, "127.0.0.1", 0, gate=self.gate, ssl_context=tls)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            started.set()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(start())
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        started.wait(10)
        self.conn: Any = HTTPConnection("127.0.0.1", self.port, timeout=30)

    def post(self, path: str, body: bytes | Any, conn: Any = None) -> tuple[int, Any]:
        import json

        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn = conn or self.conn
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else None

    def get(self, path: str, conn: Any = None) -> tuple[int, str]:
        conn = conn or self.conn
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()

    def stop(self) -> None:
        import asyncio

        self.loop.call_soon_threadsafe(self.gate.close_idle)  # as `egpu scheduler` stops
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@dataclass(frozen=True)
class TestPki:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, as PEM
    files in one directory (for the extender's --tls-* options and kube-scheduler's
    extender tlsConfig)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    #: a client certificate signed by another CA (must be refused)
    stranger_cert: Path
    stranger_key: Path

    __test__ = False  # not a pytest test class

    @staticmethod
    def create(directory: Path, key_type: str = "ec") -> TestPki:
        """`key_type`: "ec" (P-256) or "rsa" (2048 bits, what helm's genCA and genSignedCert
        make)."""
        import datetime
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec, rsa
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        now = datetime.datetime.now(datetime.UTC)
        Key = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

        def new_key() -> Key:
            if key_type == "rsa":
                return rsa.generate_private_key(public_exponent=65537, key_size=2048)
            return ec.generate_private_key(ec.SECP256R1())

        def name(text: str) -> x509.Name:
            return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

        def write(stem: str, cert: x509.Certificate, key: Key) -> tuple[Path, Path]:
            cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
            cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
            key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                   serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
            return cert_path, key_path

        def ca(cn: str) -> tuple[x509.Certificate, Key]:
            key = new_key()
            cert = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(name(cn))
                    .public_key(key.public_key()).serial_number(x509.random_serial_number())
                    .not_valid_before(now - datetime.timedelta(minutes=5))
                    .not_valid_after(now + datetime.timedelta(days=1))
                    .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                    .add_extension(x509.KeyUsage(False, False, False, False, False, True, True,
                                                 False, False), critical=True)
                    .sign(key, hashes.SHA256()))
            return cert, key

        def leaf(cn: str, issuer: tuple[x509.Certificate, Key],
                 server: bool) -> tuple[x509.Certificate, Key]:
            key = new_key()
            builder = (x509.CertificateBuilder().subject_name(name(cn))
                       .issuer_name(issuer[0].subject).public_key(key.public_key())
                       .serial_number(x509.random_serial_number())
                       .not_valid_before(now - datetime.timedelta(minutes=5))
                       .not_valid_after(now + datetime.timedelta(days=1))
                       .add_extension(x509.ExtendedKeyUsage(
                           [ExtendedKeyUsageOID.SERVER_AUTH if server
                            else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
            if server:
                builder = builder.add_extension(x509.SubjectAlternativeName([
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.DNSName("localhost")]), critical=False)
            return builder.sign(issuer[1], hashes.SHA256()), key

        authority = ca("egpu-test-ca")
        ca_path = directory / "ca.crt"
        ca_path.write_bytes(authority[0].public_bytes(serialization.Encoding.PEM))
        server = write("server", *leaf("egpu-scheduler", authority, True))
        client = write("client", *leaf("kube-scheduler", authority, False))
        stranger = write("stranger", *leaf("kube-scheduler", ca("other-ca"), False))
        return TestPki(ca_path, *server, *client, *stranger)

    def client_context(self, cert: bool = True) -> Any:
        import ssl

        context = ssl.create_default_context(cafile=str(self.ca))
        if cert:
            context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


def extender_tls_stanza(pki: TestPki) -> dict[str, Any]:
    """kube-scheduler's extender tlsConfig for `pki` (files; caData/certData/keyData work too)."""
    return {"certFile": str(pki.client_cert), "keyFile": str(pki.client_key),
            "caFile": str(pki.ca)}


def api_worker_pid(extender: ExtenderProcess) -> int:
    """The pid of the extender's API worker (its one child process)."""
    assert extender.process is not None
    pid = extender.process.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    if len(children) != 1:
        raise RuntimeError(f"egpu scheduler {pid} has children {children}, expected one worker")
    return int(children[0])


@contextmanager
def paused(pid: int) -> Iterator[None]:
    """SIGSTOP a process for the block: the extender's API worker paused keeps the state's view
    of the cluster behind (no watch events) and its Bindings in flight."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def metrics_text(url: str, tls: TestPki | None = None) -> str:
    """The /metrics page at `url` (`tls`: over HTTPS with the PKI's client certificate)."""
    context = tls.client_context() if tls is not None else None
    with urllib.request.urlopen(f"{url}/metrics", timeout=5, context=context) as response:
        return str(response.read().decode())


_SAMPLE = re.compile(r'^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?$')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _labels(text: str | None) -> dict[str, str]:
    return dict(_LABEL.findall(text or ""))


def metric_value(text: str, sample: str) -> float | None:
    """The value of one sample of a Prometheus page, e.g.
    `elasticgpu_scheduler_wakeups_total{result="sent"}`: the labels given are a subset to
    match (a per-card sample may be named by node and device_index alone); several matching
    samples are summed. None when none matches."""
    wanted = _SAMPLE.match(sample)
    if wanted is None:
        raise ValueError(f"not a sample: {sample!r}")
    want = _labels(wanted["labels"])
    total: float | None = None
    for line in text.splitlines():
        if not line.startswith(wanted["name"]) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        got = _SAMPLE.match(head)
        if got is None or got["name"] != wanted["name"]:
            continue
        labels = _labels(got["labels"])
        if all(labels.get(k) == v for k, v in want.items()):
            total = (total or 0.0) + float(value)
    return total


def send_raw(port: int, head: bytes, body: bytes, timeout_s: float = 120) -> int:
    """Send one HTTP request on a raw socket (`head`: request line and headers without
    Content-Length) and return the status; the server may answer early (a 413) and close
    before the body is all sent."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        try:
            sock.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body))
            sock.sendall(body)
        except OSError:
            pass  # answered (a 413) and closed before the body was all sent: read the answer
        data = b""
        try:
            while b"\r\n" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass  # reset after the answer: what was read decides the status (0 if nothing)
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
