"""A real kubelet node for the dev cluster: containerd 2 and kubelet built from the pinned
modules (hack/ensure-k8s.sh; containerd 2 reads CDI specs, Debian's 1.6 does not), Debian's
runc, local images, joined to a `ControlPlane` as one more node beside kwok's.

`RealNode(name, work_dir, plane).start()`; `.stop()` leaves nothing behind: no process (all of
them live in the cgroup `egpu-realnode`, which is emptied with SIGKILL and removed), no mount
(they exist only in the node's private mount namespace, gone with its last process), no netns
(mounted in that namespace too), no port, no containerd state (under the work dir, removed).
`unavailable_reason()` says exactly why a machine cannot run one (not root, no mount
namespaces, a missing package ...), so callers skip instead of faking it.

The workarounds (docs/sandbox.md, "A real kubelet node", says why each is needed):
containerd runs with `restrict_oom_score_adj`, cgroupfs, the local pause image and our CNI
plugin (`cni_plugin.py`); kubelet with `failCgroupV1: false`, `failSwapOn: false` and
`--cloud-provider=external`, so that the node's addresses are ours to set: kubelet refuses a
loopback `--node-ip`, and the apiserver must reach it at `InternalIP 127.0.0.1` for
`kubectl logs`; we then remove the "uninitialized" taint, as a cloud controller would. Both
run in a private mount namespace (`realnode_ns.py`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from elastic_gpu.devcluster import images
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.errors import DevClusterError
from elastic_gpu.devcluster.kubeconfig import write_kubeconfig
from elastic_gpu.devcluster.ports import free_ports
from elastic_gpu.devcluster.process import ProcessHandle, spawn, wait_ready
from elastic_gpu.devcluster.realnode_config import (
    CGROUP_ROOT,
    RUNTIME_CGROUP,
    RealNodePaths,
    cni_conflist,
    containerd_config,
    kubelet_config,
)
from elastic_gpu.devcluster.realnode_ns import lock_holder, take_start_claim

DEFAULT_NAME = "egpu-real-0"
REAL_NODE_LABEL = "elasticgpu.io/real-node"
UNINITIALIZED_TAINT = "node.cloudprovider.kubernetes.io/uninitialized"
#: The real node is tainted so that only pods meant for it (tolerating this, using the local
#: images) go there: a kwok pod with an image that cannot be pulled would fail on it.
REAL_NODE_TAINT = {"key": REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"}
REAL_NODE_TOLERATION = {"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}
START_TIMEOUT_S = 90.0
#: Debian package of each command the real node runs.
PACKAGES = {"runc": "runc",
            "ip": "iproute2", "nsenter": "util-linux", "unshare": "util-linux",
            "mount": "mount"}
CGROUP_FS = "/sys/fs/cgroup"
#: Built by hack/ensure-k8s.sh into the control plane's bin directory; containerd finds its shim
#: on PATH, so the bin directory comes first on containerd's.
CONTAINERD_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")


class RealNodeUnavailable(DevClusterError):
    """This machine cannot run a real node; the message says exactly why."""


class RealNodeBusy(DevClusterError):
    """Another real node runs, starts or stops on this machine (one per machine)."""


# -- can this machine run one? ------------------------------------------------------------

def _which(name: str) -> str | None:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def unavailable_reason(bin_dir: Path | None = None) -> str | None:
    """None when this machine can run a real node, else every reason it cannot."""
    reasons: list[str] = []
    if sys.platform != "linux":
        return f"a real node needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        reasons.append(f"not root (uid {os.geteuid()}): containerd, runc and kubelet need "
                       "root")
    missing = sorted({PACKAGES[c] for c in PACKAGES if _which(c) is None})
    if missing:
        reasons.append("missing Debian packages: " + " ".join(missing)
                       + " (scripts/realnode-packages.sh installs them as root)")
    try:
        images.find_busybox()
    except images.ImageBuildError as err:
        reasons.append(str(err))
    if not reasons:
        reason = _probe_namespace()
        if reason is not None:
            reasons.append(reason)
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        filesystems = ""
    if "\toverlay\n" not in filesystems:
        reasons.append("the kernel has no overlay filesystem (containerd's snapshotter and the "
                       "namespace's /var/lib need it)")
    if not cgroup_mounts():
        reasons.append(f"no cgroup filesystem mounted under {CGROUP_FS}")
    for built in ("kubelet", *CONTAINERD_BINARIES):
        if bin_dir is not None and not os.access(bin_dir / built, os.X_OK):
            reasons.append(f"no {built} in {bin_dir} (hack/ensure-k8s.sh builds it)")
    return "; ".join(reasons) if reasons else None


def _probe_namespace() -> str | None:
    """Can we make a private mount namespace with an overlay over /var/lib, as the node's
    namespace does? (Not where /tmp cannot be an overlay's upper layer, e.g. itself overlayfs.)"""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="egpu-rn-probe-") as tmp:
        upper, work = Path(tmp) / "u", Path(tmp) / "w"
        upper.mkdir()
        work.mkdir()
        probe = subprocess.run(
            [str(_which("unshare")), "--mount", "--propagation", "private", "--",
             str(_which("mount")), "-t", "overlay", "overlay", "-o",
             f"lowerdir=/var/lib,upperdir={upper},workdir={work}", "/var/lib"],
            capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return ("cannot mount an overlay over /var/lib in a private mount namespace "
                f"(`unshare --mount` + `mount -t overlay` failed: {probe.stderr.strip()})")
    return None


# -- cgroups --------------------------------------------------------------------------------

def cgroup_mounts() -> list[Path]:
    """Mount points of every cgroup hierarchy (v1 controllers, named ones, the v2 tree)."""
    mounts = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        pre, _, post = line.partition(" - ")
        fstype = post.split()[0] if post else ""
        if fstype in ("cgroup", "cgroup2"):
            mounts.append(Path(pre.split()[4]))
    return mounts


def _is_v2(mount: Path) -> bool:
    return (mount / "cgroup.controllers").exists()


def _cgroup_dirs(relative: str) -> list[Path]:
    return [m / relative for m in cgroup_mounts()]


def create_runtime_cgroups() -> list[Path]:
    """`egpu-realnode/runtime` in every hierarchy; the cgroup.procs files to join."""
    procs = []
    for mount in cgroup_mounts():
        root = mount / CGROUP_ROOT
        runtime = mount / RUNTIME_CGROUP
        for directory in (root, runtime):
            directory.mkdir(exist_ok=True)
            # A v1 cpuset child starts with no CPUs and no memory nodes: copy its parent's.
            for name in ("cpuset.cpus", "cpuset.mems"):
                mine = directory / name
                if (mount / name).exists() and mine.exists() and not mine.read_text().strip():
                    mine.write_text((directory.parent / name).read_text())
        if _is_v2(mount) and (mount / "cgroup.controllers").read_text().strip():
            wanted = set((root / "cgroup.controllers").read_text().split())
            with contextlib.suppress(OSError):
                (root / "cgroup.subtree_control").write_text(
                    " ".join(f"+{c}" for c in sorted(wanted)))
        procs.append(runtime / "cgroup.procs")
    return procs


def cgroup_pids() -> set[int]:
    """Every process in the real node's cgroups (any hierarchy)."""
    pids: set[int] = set()
    for top in _cgroup_dirs(CGROUP_ROOT):
        if not top.is_dir():
            continue
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def kill_cgroup_processes(timeout_s: float = 15.0) -> None:
    """SIGKILL everything in the real node's cgroups until they are empty."""
    deadline = time.monotonic() + timeout_s
    while pids := cgroup_pids():
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise DevClusterError(f"processes {sorted(pids)} in cgroup {CGROUP_ROOT} survive "
                                  "SIGKILL")
        time.sleep(0.05)


def remove_cgroups(timeout_s: float = 10.0) -> None:
    """Remove the real node's cgroup trees, deepest first (they must be empty)."""
    deadline = time.monotonic() + timeout_s
    for top in _cgroup_dirs(CGROUP_ROOT):
        if not top.is_dir():
            continue
        directories = sorted((p for p in top.rglob("*") if p.is_dir()),
                             key=lambda p: len(p.parts), reverse=True)
        for directory in [*directories, top]:
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as err:  # EBUSY for a moment after its last process died
                    if time.monotonic() > deadline:
                        raise DevClusterError(f"cannot remove cgroup {directory}: {err}") \
                            from None
                    time.sleep(0.05)


def leftover_cgroups() -> list[Path]:
    return [d for d in _cgroup_dirs(CGROUP_ROOT) if d.exists()]


# -- the node's identity ----------------------------------------------------------------------

def issue_node_certificate(ca_cert: Path, ca_key: Path, name: str, cert_path: Path,
                           key_path: Path) -> None:
    """A client certificate for `system:node:<name>` in group `system:nodes`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    signing_key = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
    if not isinstance(signing_key, ec.EllipticCurvePrivateKey):
        raise DevClusterError(f"{ca_key}: expected the dev cluster's EC CA key")
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([
                x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{name}"),
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes")]))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + dt.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(signing_key, hashes.SHA256()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)


def node_rbac_manifest(name: str) -> dict[str, Any]:
    """Binds `system:node:<name>` to the `system:node` ClusterRole (the dev cluster authorizes
    with RBAC only; there is no Node authorizer)."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": f"egpu-realnode:{name}", "labels": {REAL_NODE_LABEL: "true"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "system:node"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": f"system:node:{name}"}]}


# -- the node -------------------------------------------------------------------------------

_JOIN_CGROUP = 'for p in $EGPU_CGROUP_PROCS; do echo $$ > "$p" || exit 97; done; exec "$@"'


@dataclass
class RealNode:
    """One real kubelet node of `plane`'s cluster, everything under `work_dir`."""

    name: str
    work_dir: Path
    plane: ControlPlane
    kubelet_port: int = 0
    healthz_port: int = 0
    busybox_image: str = ""
    processes: dict[str, ProcessHandle] = field(default_factory=dict)
    die_with_parent: bool = False
    kubelet_starts: int = 0
    #: Register with `REAL_NODE_TAINT` (pods must tolerate it: `REAL_NODE_TOLERATION`).
    taint: bool = True
    #: Called after each process starts (the sandbox records pids before waiting on them).
    on_spawn: Callable[[RealNode], None] | None = field(default=None, repr=False)

    @property
    def paths(self) -> RealNodePaths:
        return RealNodePaths(self.work_dir)

    @property
    def device_plugin_dir(self) -> Path:
        """Where an agent on the host serves device plugins for this node's kubelet."""
        return self.paths.device_plugin_dir

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, timeout_s: float = START_TIMEOUT_S) -> RealNode:
        """Start the namespace, containerd and kubelet; return once the Node is Ready.
        On any failure, stop what started and re-raise."""
        reason = unavailable_reason(self.plane.bin_dir)
        if reason is not None:
            raise RealNodeUnavailable(f"cannot run a real node here: {reason}")
        claim = take_start_claim()
        if claim is None:
            raise RealNodeBusy(
                "a real node is being started or stopped on this machine (another process "
                "holds @egpu-realnode-start); one per machine")
        try:
            holder = lock_holder()
            if holder is not None:
                raise RealNodeBusy(
                    f"a real node already runs on this machine (pid {holder} holds the lock "
                    "@egpu-realnode): kubelet and containerd assume they own the machine (its "
                    "cgroups, /dev/kmsg, the capacity they report), so there is one per "
                    "machine. Stop it first (`egpu sandbox down`, or the test run that started "
                    "it)")
            # A node killed without teardown (SIGKILL) may have left pods and shims in its
            # cgroups: nobody holds the lock and nobody else is starting, so they are litter.
            kill_cgroup_processes()
            remove_cgroups()
            try:
                self._prepare()
                self._start_namespace(timeout_s)
                self._start_containerd(timeout_s)
                self._import_images()
                self._join_cluster()
                self.start_kubelet(timeout_s)
            except BaseException:
                self._stop(claimed=True)
                raise
        finally:
            claim.close()
        return self

    def _prepare(self) -> None:
        paths = self.paths
        # Unix socket paths hold at most 107 bytes; the longest here is a device plugin's,
        # `egpu-<resource>.sock` (about 40 bytes) in the device-plugin directory.
        if len(str(self.device_plugin_dir)) > 66:
            raise DevClusterError(
                f"work dir {self.work_dir} is too long for the sockets under it "
                f"({self.device_plugin_dir} is {len(str(self.device_plugin_dir))} bytes, at "
                "most 66): choose a shorter one")
        shutil.rmtree(self.work_dir, ignore_errors=True)
        for directory in (paths.cni_bin, paths.cni_conf, paths.cni_state, paths.logs,
                          paths.images, paths.containerd_root.parent, paths.cdi_dir):
            directory.mkdir(parents=True, exist_ok=True)
        if not self.kubelet_port:
            self.kubelet_port, self.healthz_port = free_ports(2)
        written = images.write_images(paths.images)
        self.busybox_image = next(ref for ref in written if ref != images.PAUSE_IMAGE)
        paths.resolv_conf.write_text("nameserver 127.0.0.1\noptions ndots:1\n")
        paths.containerd_config.write_text(containerd_config(paths, images.PAUSE_IMAGE))
        (paths.cni_conf / "10-egpu.conflist").write_text(json.dumps(cni_conflist(paths)))
        plugin = Path(__file__).with_name("cni_plugin.py")
        for name in ("egpu-veth", "loopback"):
            wrapper = paths.cni_bin / name
            wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -I {plugin} \"$@\"\n")
            wrapper.chmod(0o755)

    def _spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
               ) -> ProcessHandle:
        procs = create_runtime_cgroups()
        path = (env or {}).get("PATH") or os.environ.get("PATH", "/usr/bin:/bin")
        full_env = {**os.environ, **(env or {}), "EGPU_CGROUP_PROCS": " ".join(map(str, procs)),
                    "PATH": f"{path}:/usr/sbin:/sbin"}
        handle = spawn(name, ["/bin/sh", "-c", _JOIN_CGROUP, name, *argv],
                       self.paths.logs / f"{name}.log", full_env,
                       die_with_parent=self.die_with_parent)
        self.processes[name] = handle
        if self.on_spawn is not None:
            self.on_spawn(self)
        return handle

    def _in_namespace(self, argv: Sequence[str]) -> list[str]:
        holder = self.processes["namespace"]
        return [str(_which("nsenter")), f"--mount=/proc/{holder.pid}/ns/mnt", "--", *argv]

    def _start_namespace(self, timeout_s: float) -> None:
        paths = self.paths
        paths.ready_file.unlink(missing_ok=True)
        handle = self._spawn("namespace", [
            str(_which("unshare")), "--mount", "--propagation", "private", "--",
            sys.executable, "-m", "elastic_gpu.devcluster.realnode_ns", str(self.work_dir)])
        wait_ready(handle, paths.ready_file.exists, timeout_s, interval_s=0.02)

    def _start_containerd(self, timeout_s: float) -> None:
        bin_dir = self.plane.bin_dir
        handle = self._spawn("containerd", self._in_namespace([
            str(bin_dir / "containerd"), "--config", str(self.paths.containerd_config),
            "--log-level", "warn"]),
            env={"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"})
        wait_ready(handle, lambda: self._ctr("version", check=False).returncode == 0,
                   timeout_s, interval_s=0.1)

    def _ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(self.plane.bin_dir / "ctr"), "--address",
                                 str(self.paths.containerd_socket), "--namespace", "k8s.io",
                                 *args], capture_output=True, text=True, check=False,
                                timeout=120)
        if check and result.returncode != 0:
            raise DevClusterError(f"ctr {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def import_image(self, tar: Path) -> None:
        """Load a docker-archive tar into this node's containerd (pods: `imagePullPolicy:
        Never`, or a tag other than `latest`)."""
        self._ctr("images", "import", str(tar))

    def _import_images(self) -> None:
        for tar in sorted(self.paths.images.glob("*.tar")):
            self._ctr("images", "import", str(tar))

    def _join_cluster(self) -> None:
        pki = self.plane.pki
        cert, key = self.work_dir / "node.crt", self.work_dir / "node.key"
        issue_node_certificate(pki.ca_cert, pki.ca_key, self.name, cert, key)
        write_kubeconfig(self.paths.kubelet_kubeconfig, self.plane.server, pki,
                         client=(cert, key))
        self.plane.kubectl("apply", "-f", "-", input=json.dumps(node_rbac_manifest(self.name)))
        config = kubelet_config(self.paths, port=self.kubelet_port,
                                healthz_port=self.healthz_port, ca_file=pki.ca_cert,
                                taints=[REAL_NODE_TAINT] if self.taint else [])
        self.paths.kubelet_config.write_text(yaml.safe_dump(config, sort_keys=False))

    def start_kubelet(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """(Re)start kubelet; returns once the Node is Ready with its loopback address."""
        self.kubelet_starts += 1
        handle = self._spawn("kubelet", self._in_namespace([
            str(self.plane.bin_dir / "kubelet"),
            f"--config={self.paths.kubelet_config}",
            f"--kubeconfig={self.paths.kubelet_kubeconfig}",
            f"--hostname-override={self.name}",
            "--cloud-provider=external",
            f"--node-labels={REAL_NODE_LABEL}=true",
            "--v=1",
        ]))
        wait_ready(handle, self._node_exists, timeout_s, interval_s=0.1)
        self._initialize_node()
        wait_ready(handle, self.ready, timeout_s, interval_s=0.1)

    def _node(self) -> dict[str, Any] | None:
        result = self.plane.kubectl("get", "node", self.name, "-o", "json", check=False)
        if result.returncode != 0:
            return None
        node: dict[str, Any] = json.loads(result.stdout)
        return node

    def _node_exists(self) -> bool:
        return self._node() is not None

    def _initialize_node(self) -> None:
        """What a cloud controller does for an external-cloud-provider node: set its address
        (InternalIP 127.0.0.1, where kubelet listens) and lift the 'uninitialized' taint."""
        node = self._node()
        if node is None:
            raise DevClusterError(f"node {self.name} vanished while starting")
        self.plane.kubectl("patch", "node", self.name, "--subresource=status", "--type=merge",
                           "-p", json.dumps({"status": {"addresses": [
                               # No Hostname address: the apiserver prefers it, and a name
                               # could resolve to ::1, where kubelet does not listen.
                               {"type": "InternalIP", "address": "127.0.0.1"}]}}))
        taints = [t for t in (node.get("spec", {}).get("taints") or [])
                  if t.get("key") != UNINITIALIZED_TAINT]
        self.plane.kubectl("patch", "node", self.name, "--type=merge",
                           "-p", json.dumps({"spec": {"taints": taints or None}}))

    def ready(self) -> bool:
        node = self._node()
        if node is None:
            return False
        conditions = node.get("status", {}).get("conditions") or []
        addresses = node.get("status", {}).get("addresses") or []
        return (any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
                and {"type": "InternalIP", "address": "127.0.0.1"} in addresses)

    def stop_kubelet(self) -> None:
        handle = self.processes.pop("kubelet", None)
        if handle is not None:
            handle.stop()

    def restart_kubelet(self, timeout_s: float = START_TIMEOUT_S) -> None:
        self.stop_kubelet()
        self.start_kubelet(timeout_s)

    def stop(self, *, delete_node: bool = False) -> None:
        """Stop kubelet, containerd and every pod; remove cgroups and the work dir.
        `delete_node`: also delete the Node object (when the cluster stays up)."""
        claim = take_start_claim()
        try:
            self._stop(delete_node=delete_node, claimed=claim is not None)
        finally:
            if claim is not None:
                claim.close()

    def _stop(self, *, delete_node: bool = False, claimed: bool) -> None:
        errors: list[str] = []
        # The cgroup sweep below kills whatever is in egpu-realnode: only when that is ours
        # (our namespace holds the machine's lock, or nobody does) and no other process is
        # starting a node into it (`claimed`: we hold the start claim), never another's.
        holder = lock_holder()
        namespace = self.processes.get("namespace")
        ours = claimed and (holder is None or (namespace is not None and namespace.alive()
                                               and holder == namespace.pid))
        for name in ("kubelet", "containerd", "namespace"):
            handle = self.processes.get(name)
            if handle is None:
                continue
            try:
                handle.stop(grace_s=5.0)
            except Exception as err:  # keep going: the cgroup sweep below catches the rest
                errors.append(f"{name}: {err}")
        if ours:
            try:
                kill_cgroup_processes()
                remove_cgroups()
            except DevClusterError as err:
                errors.append(str(err))
        # Stopped is judged by our own processes (pid and recorded start time), never by
        # probing ports: on a busy machine another program may already listen on a freed one.
        still = [f"{name} (pid {handle.pid})" for name, handle in self.processes.items()
                 if handle.alive()]
        if still:
            errors.append(f"still running: {', '.join(still)}")
        self.processes.clear()
        if delete_node:
            with contextlib.suppress(Exception):
                self.plane.kubectl("delete", "node", self.name, "--wait=false", check=False)
                self.plane.kubectl("delete", "clusterrolebinding",
                                   f"egpu-realnode:{self.name}", check=False)
        shutil.rmtree(self.work_dir, ignore_errors=True)
        if errors:
            raise DevClusterError("real node teardown: " + "; ".join(errors))

    def alive(self) -> dict[str, bool]:
        return {name: handle.alive() for name, handle in self.processes.items()}

    # -- persistence (sandbox) -----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "work_dir": str(self.work_dir),
                "kubelet_port": self.kubelet_port, "healthz_port": self.healthz_port,
                "busybox_image": self.busybox_image, "taint": self.taint,
                "processes": [p.to_dict() for p in self.processes.values()]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], plane: ControlPlane) -> RealNode:
        return cls(name=str(data["name"]), work_dir=Path(str(data["work_dir"])), plane=plane,
                   kubelet_port=int(data["kubelet_port"]),
                   healthz_port=int(data["healthz_port"]),
                   busybox_image=str(data.get("busybox_image", "")),
                   taint=bool(data.get("taint", True)),
                   processes={str(p["name"]): ProcessHandle.from_dict(p)
                              for p in data["processes"]})

