"""A local Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler(s) and kwok.

Real binaries (hack/ensure-k8s.sh), real TLS and RBAC, loopback only. Every component is a
supervised process group; `stop()` leaves no process and no listening port behind, and a
failed start stops what had started before raising the failing component's log.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from elastic_gpu.devcluster import kwok
from elastic_gpu.devcluster.binaries import find_bin_dir
from elastic_gpu.devcluster.errors import DevClusterError
from elastic_gpu.devcluster.kubeconfig import write_kubeconfig
from elastic_gpu.devcluster.pki import Pki, create_pki, pki_paths
from elastic_gpu.devcluster.ports import HOST, free_ports, require_free
from elastic_gpu.devcluster.process import ProcessHandle, spawn, wait_ready
from elastic_gpu.kube.sync import SyncKubeClient

DEFAULT_SCHEDULER_NAME = "default-scheduler"
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/12"
START_TIMEOUT_S = 60.0
CONTROLLER_MANAGER = "kube-controller-manager"

#: Controllers kube-controller-manager runs: all of its defaults ("*": deployment, replicaset,
#: job, cronjob, garbage collector, namespace, resourcequota, serviceaccount and its token
#: controller, node lifecycle, ...) less node IPAM, which hands out pod CIDRs to nodes (kwok
#: nodes need none; --allocate-node-cidrs is off), and the cloud controllers (no cloud
#: provider: they would only log that they skip). bootstrapsigner and tokencleaner are off by
#: default.
CONTROLLERS = ("*,-node-ipam-controller,-service-lb-controller,-node-route-controller,"
               "-cloud-node-lifecycle-controller")


def apiserver_disabled_admission_plugins(controller_manager: bool) -> list[str]:
    """Admission plugins the dev apiserver turns off.

    TaintNodesByCondition taints every new node not-ready until the node lifecycle controller
    sees it Ready: kept off, so fake nodes take pods the moment kwok marks them Ready. Without
    kube-controller-manager, ServiceAccount is off too: it insists on each namespace's
    `default` ServiceAccount, which only that controller creates.
    """
    plugins = ["TaintNodesByCondition"]
    if not controller_manager:
        plugins.insert(0, "ServiceAccount")
    return plugins


@dataclass
class SchedulerHandle:
    """A kube-scheduler process run against the control plane, with the names it serves."""

    process: ProcessHandle
    port: int
    scheduler_names: tuple[str, ...]
    config_path: Path

    def stop(self) -> None:
        self.process.stop()

    def alive(self) -> bool:
        return self.process.alive()


def scheduler_names(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The schedulerName of each profile (kube-scheduler's default profile if none)."""
    profiles = config.get("profiles") or [{}]
    return tuple(str(p.get("schedulerName", DEFAULT_SCHEDULER_NAME)) for p in profiles)


def _get_ok(url: str, context: ssl.SSLContext | None) -> bool:
    try:
        with urllib.request.urlopen(url, context=context, timeout=2) as response:
            return int(response.status) == 200
    except urllib.error.HTTPError:
        return False


@dataclass
class ControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager, + kube-scheduler, + kwok) under
    `work_dir`."""

    work_dir: Path
    bin_dir: Path = field(default_factory=find_bin_dir)
    apiserver_port: int = 0
    etcd_port: int = 0
    etcd_peer_port: int = 0
    kwok_port: int = 0
    controller_manager_port: int = 0
    #: Whether kube-controller-manager runs (and so the ServiceAccount admission plugin).
    controller_manager: bool = True
    processes: dict[str, ProcessHandle] = field(default_factory=dict)
    schedulers: dict[str, SchedulerHandle] = field(default_factory=dict)
    #: Components get SIGKILL when the starting process dies (tests: nothing outlives pytest).
    die_with_parent: bool = False
    #: Called after each process starts (the sandbox records pids before waiting on them).
    on_spawn: Callable[[ControlPlane], None] | None = field(default=None, repr=False)
    #: Added to every component's environment (the sandbox marks its processes, so `down`
    #: also finds what they started in sessions of their own).
    extra_env: dict[str, str] = field(default_factory=dict, repr=False)
    #: Added to kube-apiserver's command line (a test that needs a feature gate off).
    apiserver_args: tuple[str, ...] = ()
    #: The admin client `kube()` hands out, made on first use and closed by `stop()`.
    _kube: SyncKubeClient | None = field(default=None, init=False, repr=False, compare=False)
    _kube_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False,
                                       compare=False)

    # -- paths -------------------------------------------------------------------------
    @property
    def pki(self) -> Pki:
        return pki_paths(self.work_dir / "pki")

    @property
    def kubeconfig(self) -> Path:
        return self.work_dir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://{HOST}:{self.apiserver_port}"

    def _log(self, name: str) -> Path:
        return self.work_dir / "logs" / f"{name}.log"

    def _bin(self, name: str) -> str:
        return str(self.bin_dir / name)

    def _spawn(self, name: str, argv: Sequence[str],
               env: Mapping[str, str] | None = None) -> ProcessHandle:
        if self.extra_env:
            env = {**(os.environ if env is None else env), **self.extra_env}
        handle = spawn(name, argv, self._log(name), env, die_with_parent=self.die_with_parent)
        self.processes[name] = handle
        if self.on_spawn is not None:
            self.on_spawn(self)
        return handle

    def start_process(self, name: str, argv: Sequence[str],
                      env: Mapping[str, str] | None = None) -> ProcessHandle:
        """Run one more supervised process (stopped with the others, newest first)."""
        if name in self.processes and self.processes[name].alive():
            raise DevClusterError(f"a component named {name} is already running")
        return self._spawn(name, argv, env)

    def client_tls(self) -> ssl.SSLContext:
        """TLS to kube-apiserver as its admin (the kubeconfig's client certificate)."""
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        ctx.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return ctx

    # -- lifecycle ---------------------------------------------------------------------
    def start(self, *, scheduler: bool | Mapping[str, Any] = True, kwok_enabled: bool = True,
              controller_manager: bool | None = None,
              timeout_s: float = START_TIMEOUT_S) -> ControlPlane:
        """Start everything; on any failure stop what started and re-raise.

        `controller_manager`: run kube-controller-manager (default: `self.controller_manager`).
        """
        if controller_manager is not None:
            self.controller_manager = controller_manager
        try:
            self.prepare()
            self.start_etcd(timeout_s)
            self.start_apiserver(timeout_s)
            if self.controller_manager:
                self.start_controller_manager(timeout_s)
            if scheduler:
                config = scheduler if isinstance(scheduler, Mapping) else {}
                self.start_scheduler(config, name="kube-scheduler", timeout_s=timeout_s)
            if kwok_enabled:
                self.start_kwok(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def prepare(self) -> None:
        """Ports, certificates and the admin kubeconfig: what every component needs first."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._allocate_ports()
        create_pki(self.work_dir / "pki")
        write_kubeconfig(self.kubeconfig, self.server, self.pki)

    def _allocate_ports(self) -> None:
        """etcd's and kube-apiserver's ports (the kubeconfigs name the latter). The others are
        drawn as their component starts (`_port`): a port drawn here is bound only after
        kube-apiserver is up, seconds later on a busy machine, and meanwhile another cluster's
        draw may take it."""
        wanted = {"apiserver_port": "kube-apiserver", "etcd_port": "etcd client",
                  "etcd_peer_port": "etcd peer"}
        fresh = iter(free_ports(len(wanted)))
        for attr, what in wanted.items():
            if getattr(self, attr):
                require_free(getattr(self, attr), what)
            else:
                setattr(self, attr, next(fresh))

    def _port(self, attr: str, what: str) -> int:
        """The port `attr` names, drawn now unless it was given (then it must be free)."""
        port: int = getattr(self, attr)
        if port:
            require_free(port, what)
        else:
            (port,) = free_ports(1)
            setattr(self, attr, port)
        return port

    def start_etcd(self, timeout_s: float = START_TIMEOUT_S) -> None:
        client = f"http://{HOST}:{self.etcd_port}"
        peer = f"http://{HOST}:{self.etcd_peer_port}"
        handle = self._spawn("etcd", [
            self._bin("etcd"), "--name=devcluster", f"--data-dir={self.work_dir / 'etcd'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=devcluster={peer}", "--log-level=warn",
            # Throw-away data on a shared disk: durability is worth nothing here, speed is.
            "--unsafe-no-fsync",
        ])
        wait_ready(handle, lambda: _get_ok(f"{client}/health", None), timeout_s,
                   port=self.etcd_port)

    def start_apiserver(self, timeout_s: float = START_TIMEOUT_S) -> None:
        pki = self.pki
        handle = self._spawn("kube-apiserver", [
            self._bin("kube-apiserver"),
            f"--etcd-servers=http://{HOST}:{self.etcd_port}",
            f"--secure-port={self.apiserver_port}", f"--bind-address={HOST}",
            f"--advertise-address={HOST}",
            f"--cert-dir={self.work_dir / 'apiserver-certs'}",
            f"--tls-cert-file={pki.serving_cert}", f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--disable-admission-plugins="
            + ",".join(apiserver_disabled_admission_plugins(self.controller_manager)),
            "--allow-privileged=true",
            "--profiling=false",
            *self.apiserver_args,
        ])
        tls = self.client_tls()
        wait_ready(handle, lambda: _get_ok(f"{self.server}/readyz", tls), timeout_s,
                   port=self.apiserver_port)
        # /readyz can pass a moment before the bootstrap controller has made `default`.
        wait_ready(handle, lambda: _get_ok(f"{self.server}/api/v1/namespaces/default", tls),
                   timeout_s)

    @property
    def controller_manager_kubeconfig(self) -> Path:
        return self.work_dir / "controller-manager.kubeconfig"

    def start_controller_manager(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """kube-controller-manager as `system:kube-controller-manager` (bound by the default
        RBAC policy); each controller acts as its own ServiceAccount in kube-system. Returns
        when its /healthz answers and the `default` namespace has its `default`
        ServiceAccount (so pods there pass the ServiceAccount admission plugin)."""
        pki = self.pki
        port = self._port("controller_manager_port", CONTROLLER_MANAGER)
        write_kubeconfig(self.controller_manager_kubeconfig, self.server, pki,
                         client=(pki.controller_manager_cert, pki.controller_manager_key))
        handle = self._spawn(CONTROLLER_MANAGER, [
            self._bin(CONTROLLER_MANAGER),
            f"--kubeconfig={self.controller_manager_kubeconfig}",
            f"--secure-port={port}", f"--bind-address={HOST}",
            f"--cert-dir={self.work_dir / 'controller-manager-certs'}",
            # Signs the tokens the apiserver verifies with --service-account-key-file.
            f"--service-account-private-key-file={pki.sa_key}",
            f"--root-ca-file={pki.ca_cert}",  # kube-root-ca.crt in every namespace
            # The CSR signer (kubelet client and serving certificates) signs with the CA.
            f"--cluster-signing-cert-file={pki.ca_cert}",
            f"--cluster-signing-key-file={pki.ca_key}",
            "--use-service-account-credentials=true",
            f"--controllers={CONTROLLERS}",
            "--allocate-node-cidrs=false",
            "--leader-elect=false",
            # The default 20/s throttles namespace deletion and ReplicaSets of hundreds of
            # pods; a loopback dev apiserver takes far more.
            "--kube-api-qps=200", "--kube-api-burst=400",
            "--profiling=false",
        ])
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # its self-signed serving cert; loopback only
        wait_ready(handle, lambda: _get_ok(f"https://{HOST}:{port}/healthz", insecure),
                   timeout_s, port=port)
        tls = self.client_tls()
        wait_ready(handle, lambda: _get_ok(
            f"{self.server}/api/v1/namespaces/default/serviceaccounts/default", tls), timeout_s)

    def start_scheduler(self, config: Mapping[str, Any] | None = None, *,
                        name: str | None = None,
                        timeout_s: float = START_TIMEOUT_S) -> SchedulerHandle:
        """Run a kube-scheduler with a KubeSchedulerConfiguration (dict) against this cluster.

        Connection and leader election are filled in; each profile's schedulerName must be
        one no running scheduler of this cluster serves, or two schedulers would race.
        """
        cfg: dict[str, Any] = dict(config or {})
        cfg.setdefault("apiVersion", "kubescheduler.config.k8s.io/v1")
        cfg.setdefault("kind", "KubeSchedulerConfiguration")
        cfg["clientConnection"] = {**cfg.get("clientConnection", {}),
                                   "kubeconfig": str(self.kubeconfig)}
        cfg["leaderElection"] = {**cfg.get("leaderElection", {}), "leaderElect": False}
        names = scheduler_names(cfg)
        for other in self.schedulers.values():
            if other.alive() and set(names) & set(other.scheduler_names):
                raise DevClusterError(
                    f"scheduler name(s) {sorted(set(names) & set(other.scheduler_names))} are "
                    f"already served by {other.process.name}; give each profile of the new "
                    "KubeSchedulerConfiguration its own schedulerName")
        name = name or f"kube-scheduler-{'-'.join(names)}"
        if name in self.schedulers and self.schedulers[name].alive():
            raise DevClusterError(f"a scheduler named {name} is already running")
        (port,) = free_ports(1)
        config_path = self.work_dir / f"{name}.yaml"
        config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        handle = self._spawn(name, [
            self._bin("kube-scheduler"), f"--config={config_path}",
            f"--secure-port={port}", f"--bind-address={HOST}",
            f"--cert-dir={self.work_dir / (name + '-certs')}",
        ])
        scheduler = SchedulerHandle(handle, port, names, config_path)
        self.schedulers[name] = scheduler
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # its self-signed serving cert; loopback only
        try:
            wait_ready(handle, lambda: _get_ok(f"https://{HOST}:{port}/readyz", insecure),
                       timeout_s, port=port)
        except BaseException:
            handle.stop()
            raise
        return scheduler

    def start_kwok(self, timeout_s: float = START_TIMEOUT_S) -> None:
        config_path = self.work_dir / "kwok.yaml"
        config_path.write_text(kwok.kwok_config_yaml())
        port = self._port("kwok_port", "kwok")
        handle = self._spawn("kwok", [
            self._bin("kwok"), f"--config={config_path}", f"--kubeconfig={self.kubeconfig}",
            f"--server-address={HOST}:{port}",
        ], env={**os.environ, "HOME": str(self.work_dir)})
        wait_ready(handle, lambda: _get_ok(f"http://{HOST}:{port}/healthz", None),
                   timeout_s, port=port)

    def close_client(self) -> None:
        """Close `kube()`'s client, if one was made (a later `kube()` makes a new one): when
        this process is done with a plane that keeps running (`egpu sandbox up` returns)."""
        with self._kube_lock:
            kube, self._kube = self._kube, None
        if kube is not None:
            kube.close()

    def stop(self) -> None:
        """Stop every component, newest first (clients before the apiserver before etcd)."""
        self.close_client()
        errors = []
        for name in reversed(list(self.processes)):
            try:
                self.processes[name].stop()
            except Exception as err:  # keep stopping the others; report all at the end
                errors.append(f"{name}: {err}")
        if errors:
            raise DevClusterError("could not stop: " + "; ".join(errors))

    def alive(self) -> dict[str, bool]:
        return {name: p.alive() for name, p in self.processes.items()}

    def ports_of(self, name: str) -> list[int]:
        """The loopback ports component `name` listens on."""
        fixed = {"etcd": [self.etcd_port, self.etcd_peer_port],
                 "kube-apiserver": [self.apiserver_port], "kwok": [self.kwok_port],
                 CONTROLLER_MANAGER: [self.controller_manager_port]}
        if name in self.schedulers:
            return [self.schedulers[name].port]
        return fixed.get(name, [])

    def endpoint_of(self, name: str) -> str | None:
        """Where component `name` serves (its URL), if it is one of the control plane's."""
        urls = {"etcd": f"http://{HOST}:{self.etcd_port}", "kube-apiserver": self.server,
                "kwok": f"http://{HOST}:{self.kwok_port}",
                CONTROLLER_MANAGER: f"https://{HOST}:{self.controller_manager_port}"}
        if name in self.schedulers:
            return f"https://{HOST}:{self.schedulers[name].port}"
        return urls.get(name)

    # -- clients -----------------------------------------------------------------------
    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; with `check`, fail with its stderr."""
        argv = [self._bin("kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(argv, input=input, capture_output=True, text=True,
                                timeout=timeout_s, check=False)
        if check and result.returncode != 0:
            raise DevClusterError(f"kubectl {' '.join(args)} failed ({result.returncode}): "
                                  f"{result.stderr.strip()}")
        return result

    def kube(self) -> SyncKubeClient:
        """The admin identity's client (`kube.sync`, field manager `egpu-dev`): one per
        control plane, shared by the threads that use it, closed by `stop()`."""
        with self._kube_lock:
            if self._kube is None:
                self._kube = SyncKubeClient.from_config(self.kubeconfig,
                                                        field_manager="egpu-dev")
            return self._kube

    # -- persistence (sandbox) -----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "work_dir": str(self.work_dir), "bin_dir": str(self.bin_dir),
            "apiserver_port": self.apiserver_port, "etcd_port": self.etcd_port,
            "etcd_peer_port": self.etcd_peer_port, "kwok_port": self.kwok_port,
            "controller_manager_port": self.controller_manager_port,
            "controller_manager": self.controller_manager,
            "processes": [p.to_dict() for p in self.processes.values()],
            "schedulers": [{"name": n, "port": s.port, "names": list(s.scheduler_names),
                            "config_path": str(s.config_path)}
                           for n, s in self.schedulers.items()],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ControlPlane:
        processes = {str(p["name"]): ProcessHandle.from_dict(p) for p in data["processes"]}
        plane = cls(work_dir=Path(data["work_dir"]), bin_dir=Path(data["bin_dir"]),
                    apiserver_port=int(data["apiserver_port"]),
                    etcd_port=int(data["etcd_port"]),
                    etcd_peer_port=int(data["etcd_peer_port"]),
                    kwok_port=int(data["kwok_port"]),
                    controller_manager_port=int(data.get("controller_manager_port", 0)),
                    controller_manager=bool(data.get("controller_manager", False)),
                    processes=processes)
        for s in data.get("schedulers", []):
            if s["name"] in processes:
                plane.schedulers[s["name"]] = SchedulerHandle(
                    processes[s["name"]], int(s["port"]), tuple(s["names"]),
                    Path(s["config_path"]))
        return plane

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
