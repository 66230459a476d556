"""The sandbox: a control plane whose processes outlive the command that started it.

State lives in one directory: `state.json` (pids, ports, paths) and `cluster/` (certificates,
etcd data, logs). Beside Kubernetes, `up` runs the Elastic GPU components of
`components.REGISTRY` (the scheduler extender, wired into kube-scheduler; the fake nodes'
allocation sync); `--bare` runs Kubernetes alone. `up` refuses to start over a live sandbox;
`down` stops every recorded process group, ends any process still naming the state dir or
carrying its marker, unmounts what is mounted under it, checks that none of its recorded
processes runs (by pid and start time, never by probing its ports: another program may have
taken a freed one), and removes the state. A real node (`realnode_sandbox`) removes its own cgroup first.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import re
import shutil
import signal
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastic_gpu.core.annotations import MIG_DYNAMIC_LABEL
from elastic_gpu.core.model import Node
from elastic_gpu.devcluster import components, realnode_sandbox
from elastic_gpu.devcluster.binaries import find_bin_dir
from elastic_gpu.devcluster.components import ComponentEnv, ComponentSpec, Stage
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.dra_nodes import enable_dra
from elastic_gpu.devcluster.errors import ComponentStartError, DevClusterError
from elastic_gpu.devcluster.nodes import (
    FAKE_NODE_LABEL,
    AgentConfigLike,
    published_cards,
    register_fake_nodes,
)
from elastic_gpu.devcluster.ports import free_ports
from elastic_gpu.devcluster.process import ProcessHandle, wait_ready
from elastic_gpu.devcluster.procfs import PROC, stat_fields
from elastic_gpu.kube.resources import NODES
from elastic_gpu.kube.sync import SyncKubeClient
from elastic_gpu.scheduler.schedconfig import ignores_quota_names

STATE_FILE = "state.json"
ALLOCATION_SYNC = components.ALLOCATION_SYNC.name
EXTENDER = components.EXTENDER.name
#: Set in every component's environment to the state dir: `down` ends any process carrying
#: it (e.g. one a component started in a session of its own) besides the recorded groups.
MARKER_ENV = "EGPU_SANDBOX_DIR"
#: The health check of each control plane component (path on its endpoint).
_PLANE_HEALTH = {"etcd": "/health", "kube-apiserver": "/readyz",
                 "kube-controller-manager": "/healthz", "kwok": "/healthz"}


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "elastic-gpu" / "sandbox"


@dataclass
class Sandbox:
    state_dir: Path
    plane: ControlPlane
    kubeconfig: Path
    node_names: list[str]
    #: Kubernetes alone (`--bare`): no Elastic GPU components.
    bare: bool = False
    #: Per component of the registry: {"port": int, "endpoint": URL or None, "health": URL
    #: or None}; its process is `plane.processes[name]`.
    components: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Seconds each step of `up` took, in order (bench/sandbox_up.py reads them).
    up_seconds: dict[str, float] = field(default_factory=dict)
    #: kube-scheduler ignores the quota's names, so the webhook adds them (`ComponentEnv`).
    quota_names_ignored: bool = True
    #: The extender's config file (`ComponentEnv.extender_config`): a copy in the state dir.
    extender_config: Path | None = None

    def save(self) -> None:
        data = {"plane": self.plane.to_dict(), "kubeconfig": str(self.kubeconfig),
                "node_names": self.node_names, "bare": self.bare,
                "components": self.components,
                "up_seconds": self.up_seconds}
        tmp = self.state_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(self.state_dir / STATE_FILE)

    @classmethod
    def load(cls, state_dir: Path) -> Sandbox | None:
        path = state_dir / STATE_FILE
        if not path.exists():
            return None
        try:
            data: dict[str, Any] = json.loads(path.read_text())
            return cls(state_dir, ControlPlane.from_dict(data["plane"]),
                       Path(data["kubeconfig"]), [str(n) for n in data["node_names"]],
                       bare=bool(data.get("bare", False)),
                       components={str(k): dict(v)
                                   for k, v in dict(data.get("components", {})).items()},
                       up_seconds={str(k): float(v)
                                   for k, v in dict(data.get("up_seconds", {})).items()})
        except (ValueError, KeyError, TypeError) as err:
            raise DevClusterError(f"{path} is not a sandbox state file ({err}); remove "
                                  f"{state_dir} if no sandbox processes are left") from None

    def endpoint_of(self, name: str) -> str | None:
        endpoint = self.plane.endpoint_of(name)
        if endpoint is None and name in self.components:
            value = self.components[name].get("endpoint")
            endpoint = str(value) if value else None
        return endpoint

    def health_url(self, name: str) -> str | None:
        """The URL answering 200 while component `name` is healthy (None: it serves none)."""
        if name in self.components:
            value = self.components[name].get("health")
            return str(value) if value else None
        endpoint = self.plane.endpoint_of(name)
        if endpoint is None:
            return None
        return endpoint + _PLANE_HEALTH.get(name, "/healthz")  # kube-scheduler(s): /healthz


def count_ready_nodes(client: SyncKubeClient) -> tuple[int, int]:
    """(ready, total) among the sandbox's fake nodes."""
    nodes, _ = client.list(NODES.path(), {"labelSelector": f"{FAKE_NODE_LABEL}=true"})
    ready = 0
    for node in nodes:
        conditions = (node.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            ready += 1
    return ready, len(nodes)


def wait_nodes_ready(client: SyncKubeClient, expected: int, timeout_s: float,
                     check: Callable[[], None] = lambda: None) -> None:
    """Until `expected` fake nodes are Ready; `check` runs each round (raises to give up)."""
    deadline = time.monotonic() + timeout_s
    ready = total = 0
    while time.monotonic() < deadline:
        check()
        ready, total = count_ready_nodes(client)
        if ready >= expected:
            return
        time.sleep(0.2)
    raise DevClusterError(f"only {ready} of {expected} fake nodes became Ready within "
                          f"{timeout_s:.0f} s ({total} registered); see the kwok log")


def check_alive(plane: ControlPlane) -> None:
    """Raise with the log tail of the first component that has exited."""
    for name, handle in plane.processes.items():
        if not handle.alive():
            raise ComponentStartError(name, f"exited during `sandbox up` (exit code "
                                      f"{handle.exit_code()})",
                                      str(handle.log_path), handle.log_tail())


def _http_ok(url: str, timeout_s: float = 2.0) -> bool:
    """GET `url` answers 200 (HTTPS: the loopback components' self-signed certificates are
    not verified; the health paths need no credentials)."""
    context = None
    if url.startswith("https:"):
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout_s) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _wait_policies_enforced(plane: ControlPlane, timeout_s: float) -> None:
    """Until kube-apiserver enforces the ledger's admission policies (its informer sees a new
    policy a moment after it is created): a server-side dry run of a pod with a hand-written
    assignment, by a requester without the system's permission, is refused by the policy."""
    from elastic_gpu.api import admission_policies as policies

    probe = json.dumps(policies.probe_pod())
    deadline = time.monotonic() + timeout_s
    while True:
        result = plane.kubectl("create", "--dry-run=server", "-n", "default", "-f", "-",
                               f"--as={policies.PROBE_USER}", input=probe, check=False)
        if result.returncode != 0 and policies.probe_refused(result.stderr):
            return
        if time.monotonic() > deadline:
            raise DevClusterError(
                f"kube-apiserver does not enforce the admission policy {policies.POD_LEDGER} "
                f"after {timeout_s:.0f} s: a pod with a hand-written assignment was "
                f"{'refused otherwise: ' + result.stderr.strip() if result.returncode else 'accepted'}")
        time.sleep(0.2)


def _http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read()).decode("utf-8", "replace")


def _spawn_component(sandbox: Sandbox, spec: ComponentSpec) -> ProcessHandle:
    port = free_ports(1)[0] if spec.serves else 0
    endpoint = components.endpoint(spec, port)
    sandbox.components[spec.name] = {
        "port": port, "endpoint": endpoint,
        "health": endpoint + spec.ready_path if endpoint and spec.ready_path else None}
    env = ComponentEnv(kubeconfig=sandbox.plane.kubeconfig, work_dir=sandbox.plane.work_dir,
                       port=port, python=sys.executable,
                       endpoints={name: str(c["endpoint"]) for name, c in sandbox.components.items()
                                  if c.get("endpoint")},
                       quota_names_ignored=sandbox.quota_names_ignored,
                       extender_config=sandbox.extender_config)
    return sandbox.plane.start_process(spec.name, spec.argv(env))


def _wait_component(sandbox: Sandbox, handle: ProcessHandle, timeout_s: float) -> None:
    component = sandbox.components[handle.name]
    health = component.get("health")
    if health:
        wait_ready(handle, lambda: _http_ok(str(health)), timeout_s,
                   port=int(component["port"]) or None)


def _wait_knows_nodes(sandbox: Sandbox, specs: Sequence[ComponentSpec],
                      cards: Mapping[str, int], timeout_s: float) -> None:
    for spec in specs:
        if spec.knows_nodes is None:
            continue
        endpoint = str(sandbox.components[spec.name]["endpoint"])
        deadline = time.monotonic() + timeout_s
        missing: list[str] = list(cards)
        while True:
            check_alive(sandbox.plane)
            with contextlib.suppress(OSError):
                missing = spec.knows_nodes(_http_text(endpoint + "/metrics"), cards)
            if not missing:
                break
            if time.monotonic() > deadline:
                handle = sandbox.plane.processes[spec.name]
                raise ComponentStartError(
                    spec.name, f"does not know {len(missing)} of the nodes after "
                    f"{timeout_s:.0f} s (e.g. {', '.join(missing[:3])})",
                    str(handle.log_path), handle.log_tail())
            time.sleep(0.1)


def up(state_dir: Path, kubeconfig: Path, inventories: Sequence[Node], *,
       bin_dir: Path | None = None, timeout_s: float = 120.0,
       scheduler_config: Mapping[str, Any] | None = None,
       agent_config: AgentConfigLike | None = None,
       agent_configs: Mapping[str, AgentConfigLike] | None = None,
       controller_manager: bool = True, bare: bool = False, real_nodes: int = 0,
       registry: Sequence[ComponentSpec] = components.REGISTRY,
       extender_config: Path | None = None) -> Sandbox:
    """Start a sandbox with `inventories` as fake GPU nodes, Ready, and its kubeconfig.

    Runs the components of `registry` (without `bare`: the Elastic GPU scheduler extender,
    which kube-scheduler calls) beside Kubernetes. `scheduler_config`: a
    KubeSchedulerConfiguration for the sandbox's kube-scheduler instead of the one calling
    the extender; connection and leader election are filled in.
    `agent_configs` (per node name), else `agent_config`: how each node's agent publishes it
    (resource names, time-slicing replicas, MIG strategy; see `nodes.register_fake_node`).
    `controller_manager`: run kube-controller-manager (Deployments, Jobs, garbage collection,
    namespace deletion, ResourceQuota, ServiceAccounts).
    A component that fails to start, or exits before `up` is done, fails `up` with its log
    tail, and everything started is stopped.
    `real_nodes`: 0 or 1 real kubelet nodes (containerd, runc; `realnode_sandbox`) beside the
    fake ones, each with an agent (fake backend).
    `extender_config`: the scheduler extender's config file (validated by the caller with
    `scheduler.config.load_config`); copied into the state dir (removed by `down`), so the
    running extender does not depend on the caller's file.
    """
    specs = components.select(registry, bare=bare)
    state_dir = state_dir.resolve()
    existing = Sandbox.load(state_dir)
    if existing is not None:
        if any(existing.plane.alive().values()):
            raise DevClusterError(f"a sandbox is already running (state in {state_dir}); "
                                  "run `egpu sandbox down` first")
        _remove(existing)  # leftovers of a sandbox that died (e.g. a reboot)
    bins = find_bin_dir(bin_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    plane = ControlPlane(work_dir=state_dir / "cluster", bin_dir=bins,
                         controller_manager=controller_manager,
                         extra_env={MARKER_ENV: str(state_dir)})
    sandbox = Sandbox(state_dir, plane, kubeconfig.resolve(), [inv.name for inv in inventories],
                      bare=bare, quota_names_ignored=scheduler_config is None
                      or ignores_quota_names(scheduler_config))
    if extender_config is not None:
        (state_dir / "cluster").mkdir(parents=True, exist_ok=True)
        sandbox.extender_config = state_dir / "cluster" / "extender-config.yaml"
        shutil.copyfile(extender_config, sandbox.extender_config)
    if any(inv.labels.get(MIG_DYNAMIC_LABEL) == "true" for inv in inventories):
        # a group opted in to dynamic MIG: the sandbox's controller carves its cards
        (state_dir / "cluster").mkdir(parents=True, exist_ok=True)
        (state_dir / "cluster" / components.CONTROLLER_CONFIG).write_text(
            components.MIG_DYNAMIC_CONFIG)
    # Record every pid as soon as it exists: if this command is killed half-way, `down`
    # still finds what it had started.
    plane.on_spawn = lambda _plane: sandbox.save()
    last = time.monotonic()

    def step(name: str) -> None:
        nonlocal last
        now = time.monotonic()
        sandbox.up_seconds[name] = round(now - last, 3)
        last = now

    try:
        plane.prepare()
        plane.start_etcd(timeout_s)
        plane.start_apiserver(timeout_s)
        client = plane.kube()
        if any(spec.role is components.Role.SYSTEM for spec in specs):
            from elastic_gpu.api import admission_policies, gpudevice, tenant_rbac
            from elastic_gpu.kube.apply import create_or_update
            from elastic_gpu.kube.crds import (
                install_crds,
                install_elasticgpu_crds,
                install_priority_classes,
            )

            # the extender lists GPUDevices from its first moment
            install_crds(client, [gpudevice.crd_manifest()])
            install_elasticgpu_crds(client)  # the seed's claims apply from the first moment
            install_priority_classes(client)  # over-budget namespaces' pods get it
            # users bound to edit/view use claims, as in the chart
            create_or_update(client, tenant_rbac.manifests())
            # only the system writes the ledger, and the opt-out is an admin's (the
            # components run as the admin, who holds the system's permission)
            create_or_update(client, admission_policies.manifests())
        step("etcd, kube-apiserver")
        # Components before kube-scheduler start while the controller manager does.
        early = [spec for spec in specs if spec.stage is Stage.BEFORE_SCHEDULER]
        handles = [_spawn_component(sandbox, spec) for spec in early]
        if controller_manager:
            plane.start_controller_manager(timeout_s)
        step("kube-controller-manager")
        for handle in handles:
            _wait_component(sandbox, handle, timeout_s)
        step("components before kube-scheduler ready")
        extenders = [str(sandbox.components[spec.name]["endpoint"])
                     for spec in early if spec.extender]
        plane.start_scheduler(components.scheduler_config(scheduler_config, extenders),
                              name="kube-scheduler", timeout_s=timeout_s)
        plane.start_kwok(timeout_s)
        check_alive(plane)
        sandbox.save()
        kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(plane.kubeconfig, kubeconfig)
        kubeconfig.chmod(0o600)
        step("kube-scheduler, kwok")
        register_fake_nodes(client, inventories, agent_config=agent_config,
                            agent_configs=agent_configs)
        enable_dra(client, inventories)  # DRA-mode nodes: the DeviceClasses, as in the chart
        step("nodes registered")
        wait_nodes_ready(client, len(inventories), timeout_s, lambda: check_alive(plane))
        step("nodes Ready")
        per_node = agent_configs or {}
        _wait_knows_nodes(sandbox, specs, {
            inv.name: published_cards(inv, per_node.get(inv.name, agent_config))
            for inv in inventories}, timeout_s)
        step("extender knows the nodes")
        for spec in specs:
            if spec.stage is Stage.AFTER_NODES:
                _wait_component(sandbox, _spawn_component(sandbox, spec), timeout_s)
        realnode_sandbox.up(state_dir, plane, real_nodes, timeout_s=timeout_s)
        step("real nodes")
        if any(spec.role is components.Role.SYSTEM for spec in specs):
            _wait_policies_enforced(plane, timeout_s)
            step("admission policies enforced")
        check_alive(plane)
        step("components after the nodes")
        sandbox.save()
    except BaseException:
        _remove(sandbox)
        raise
    finally:
        plane.close_client()  # the plane runs on; this process's client does not
    return sandbox


def status(state_dir: Path) -> dict[str, Any]:
    """What is running: each component (pid, state, endpoint, log) and the nodes' readiness.

    A component's state is `running` (its process lives and, if it serves, its health check
    answers), `UNHEALTHY` (alive, health check failing) or `DEAD`. `running` is true when
    every component runs and every expected node is Ready.
    """
    state_dir = state_dir.resolve()
    sandbox = Sandbox.load(state_dir)
    if sandbox is None:
        return {"running": False, "state_dir": str(state_dir)}
    alive = sandbox.plane.alive()
    health_urls = {name: sandbox.health_url(name) for name in alive if alive[name]}
    with ThreadPoolExecutor(max_workers=8) as pool:
        healthy = dict(zip(health_urls, pool.map(
            lambda url: url is None or _http_ok(url, 3.0), health_urls.values()), strict=True))
    comps: dict[str, dict[str, Any]] = {}
    for name, handle in sandbox.plane.processes.items():
        state = "DEAD" if not alive[name] else "running" if healthy[name] else "UNHEALTHY"
        comps[name] = {"pid": handle.pid, "state": state, "alive": alive[name],
                       "endpoint": sandbox.endpoint_of(name), "log": str(handle.log_path)}
    result: dict[str, Any] = {
        "running": False,
        "state_dir": str(state_dir),
        "kubeconfig": str(sandbox.kubeconfig),
        "server": sandbox.plane.server,
        "bare": sandbox.bare,
        "components": comps,
        "nodes_expected": len(sandbox.node_names),
    }
    real = realnode_sandbox.status(state_dir, sandbox.plane)
    if real:
        result["real_nodes"] = real
        result["running"] = result["running"] and all(
            c["alive"] for node in real for c in node["components"].values())
    if alive.get("kube-apiserver"):
        try:
            with SyncKubeClient.from_config(sandbox.plane.kubeconfig,
                                            field_manager="egpu-dev") as client:
                ready, total = count_ready_nodes(client)
        except Exception as err:  # status must report, not crash, when the API misbehaves
            result["nodes_error"] = f"{type(err).__name__}: {err}"
        else:
            result["nodes_ready"] = ready
            result["nodes_registered"] = total
    result["running"] = (all(c["state"] == "running" for c in comps.values())
                         and result.get("nodes_ready", -1) >= len(sandbox.node_names))
    return result


def down(state_dir: Path) -> list[str]:
    """Stop the sandbox; return the names of the components that were stopped."""
    state_dir = state_dir.resolve()
    sandbox = Sandbox.load(state_dir)
    if sandbox is None:
        # No state (e.g. deleted by hand), but maybe processes of the sandbox it described.
        return [f"stray process {pid} ({cmd[:80]})"
                for pid, cmd in sorted(_end_processes(state_dir).items())]
    names = [name for name, alive in sandbox.plane.alive().items() if alive]
    names += realnode_sandbox.running(state_dir, sandbox.plane)
    _remove(sandbox)
    return names


# -- what `down` leaves: nothing ------------------------------------------------------------

def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        fields = stat_fields(PROC / str(pid))
        if fields is None:
            break
        pid = int(fields[1])
    return pids


def processes_using(state_dir: Path) -> dict[int, str]:
    """Live processes (pid -> command line) whose command line names a path inside
    `state_dir`, or whose environment carries its marker; this process and its ancestors
    left out."""
    inside = str(state_dir).encode() + b"/"
    marker = f"{MARKER_ENV}={state_dir}".encode()
    skip = _ancestors()
    found: dict[int, str] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat_fields(entry)
        if fields is None or fields[0] == "Z":
            continue
        ours = inside in cmdline
        if not ours:
            with contextlib.suppress(OSError):
                ours = marker in (entry / "environ").read_bytes().split(b"\0")
        if ours:
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode("utf-8", "replace")
    return found


def _end_processes(state_dir: Path, grace_s: float = 5.0) -> dict[int, str]:
    """SIGTERM, then SIGKILL, every process `processes_using(state_dir)` finds."""
    found = processes_using(state_dir)
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        left = processes_using(state_dir)
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while processes_using(state_dir) and time.monotonic() < deadline:
            time.sleep(0.05)
    left = processes_using(state_dir)
    if left:
        raise DevClusterError("processes of the sandbox survived SIGKILL: " + "; ".join(
            f"{pid} ({cmd[:120]})" for pid, cmd in sorted(left.items())))
    return found


def mounts_under(path: Path) -> list[str]:
    """Mount points inside `path` (deepest first), from /proc/self/mountinfo."""
    prefix = str(path) + "/"
    points = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            # field 5 is the mount point; space, tab, newline, backslash are octal escapes
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4])
            if point.startswith(prefix) or point == str(path):
                points.append(point)
    return sorted(set(points), key=lambda p: p.count("/"), reverse=True)


def _unmount_under(path: Path) -> None:
    points = mounts_under(path)
    if not points:
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    umount2: Any = libc.umount2
    mnt_detach = 2
    for point in points:
        umount2(point.encode(), mnt_detach)
    left = mounts_under(path)
    if left:
        raise DevClusterError(f"could not unmount {left} (unmount them by hand, as root)")


def survivors(plane: ControlPlane) -> list[str]:
    """The recorded processes of the sandbox still running (`name (pid N)`), each known by its
    pid and the start time recorded at its spawn: a pid since reused by another program is not
    the sandbox's. Its ports say nothing: once freed, another program on a busy machine may
    listen on one."""
    return [f"{name} (pid {handle.pid})" for name, handle in plane.processes.items()
            if handle.alive()]


def _remove(sandbox: Sandbox) -> None:
    plane = sandbox.plane
    errors: list[str] = []
    try:
        realnode_sandbox.down(sandbox.state_dir, plane)  # before its apiserver goes
    except DevClusterError as err:
        errors.append(str(err))
    try:
        plane.stop()
    except DevClusterError as err:
        errors.append(str(err))
    # Anything still naming the state dir: processes started by a component in a session of
    # their own, or of a sandbox whose state file was lost.
    try:
        _end_processes(sandbox.state_dir)
    except DevClusterError as err:
        errors.append(str(err))
    still = survivors(plane)
    if still:
        errors.append(f"still running: {', '.join(still)}")
    try:
        _unmount_under(sandbox.state_dir)
    except DevClusterError as err:
        errors.append(str(err))
    if errors:
        raise DevClusterError("sandbox not fully stopped: " + "; ".join(errors))
    # The kubeconfig we copied out names a CA that no longer exists: remove it if untouched.
    written = plane.kubeconfig
    if (sandbox.kubeconfig.exists() and written.exists()
            and sandbox.kubeconfig.read_bytes() == written.read_bytes()):
        sandbox.kubeconfig.unlink()
    shutil.rmtree(sandbox.state_dir / "cluster", ignore_errors=True)
    (sandbox.state_dir / (STATE_FILE + ".tmp")).unlink(missing_ok=True)
    (sandbox.state_dir / STATE_FILE).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        sandbox.state_dir.rmdir()  # only if nothing else is in it
