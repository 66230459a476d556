"""The real node's configuration files: containerd's, kubelet's, the CNI network's (pure).

Every value here is a workaround or a choice that docs/sandbox.md ("A real kubelet node")
explains; the paths are those of `RealNodePaths`, all under one work directory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The cgroup (in every v1 hierarchy, or the one v2 tree) holding everything of the real node:
#: containerd, its shims and kubelet in `<root>/runtime`, the pods in `<root>/kubepods` (kubelet's
#: cgroupRoot). Teardown kills what is left in it and removes it.
CGROUP_ROOT = "egpu-realnode"
RUNTIME_CGROUP = f"{CGROUP_ROOT}/runtime"
CNI_NETWORK = "egpu-veth"
#: The pod addresses our CNI plugin hands out (/32 each; no route leaves the pod).
POD_SUBNET = "10.244.0.0/16"

#: Host sysctls kubelet sets at start (`setupKernelTunables`). Inside the real node's mount
#: namespace each /proc/sys file is covered by a plain file, so kubelet writes those instead.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


@dataclass(frozen=True)
class RealNodePaths:
    """Where one real node keeps everything (under `work`), and the host's view of it."""

    work: Path

    @property
    def containerd_root(self) -> Path:
        return self.work / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.work / "containerd" / "state"

    @property
    def containerd_socket(self) -> Path:
        return self.work / "containerd" / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.work / "containerd" / "config.toml"

    @property
    def cdi_dir(self) -> Path:
        """The CDI spec directory containerd reads: an agent on the host writes the DRA
        devices it prepares here (its `dra.cdiDirectory`)."""
        return self.work / "cdi"

    @property
    def cni_bin(self) -> Path:
        return self.work / "cni" / "bin"

    @property
    def cni_conf(self) -> Path:
        return self.work / "cni" / "net.d"

    @property
    def cni_state(self) -> Path:
        return self.work / "cni" / "ipam"

    @property
    def kubelet_root(self) -> Path:
        """Mounted over /var/lib/kubelet inside the node's namespace."""
        return self.work / "kubelet"

    @property
    def device_plugin_dir(self) -> Path:
        """The host path of kubelet's /var/lib/kubelet/device-plugins/: an agent on the
        host serves its sockets here."""
        return self.kubelet_root / "device-plugins"

    @property
    def kubelet_config(self) -> Path:
        return self.work / "kubelet-config.yaml"

    @property
    def kubelet_kubeconfig(self) -> Path:
        return self.work / "kubelet.kubeconfig"

    @property
    def run_dir(self) -> Path:
        """Mounted over /run inside the namespace (/run/containerd, /run/netns, runc's state)."""
        return self.work / "run"

    @property
    def log_dir(self) -> Path:
        """Mounted over /var/log inside the namespace (/var/log/pods, /var/log/containers)."""
        return self.work / "log"

    @property
    def varlib_upper(self) -> Path:
        """Upper layer of the overlay over /var/lib inside the namespace (/var/lib/cni, the
        mount point of /var/lib/kubelet): nothing is created in the host's /var/lib."""
        return self.work / "varlib" / "upper"

    @property
    def varlib_work(self) -> Path:
        return self.work / "varlib" / "work"

    @property
    def sysctl_dir(self) -> Path:
        return self.work / "sysctl"

    @property
    def resolv_conf(self) -> Path:
        return self.work / "resolv.conf"

    @property
    def images(self) -> Path:
        return self.work / "images"

    @property
    def logs(self) -> Path:
        return self.work / "logs"

    @property
    def ready_file(self) -> Path:
        """Written by the namespace holder once its mounts are in place."""
        return self.work / "namespace.ready"


def _toml_str(value: str | Path) -> str:
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def containerd_config(paths: RealNodePaths, sandbox_image: str) -> str:
    """containerd 2 config (version 3; the build hack/ensure-k8s.sh makes): its own root, state
    and socket; CRI with cgroupfs, the local pause image, our CNI plugin,
    `restrict_oom_score_adj` (without CAP_SYS_RESOURCE runc fails with "can't get final
    child's PID from pipe"), and CDI read from `paths.cdi_dir`, where an agent on the host
    writes the DRA devices it prepares (docs/dra.md)."""
    runtime = 'plugins."io.containerd.cri.v1.runtime"'
    return "\n".join([
        "version = 3",
        f"root = {_toml_str(paths.containerd_root)}",
        f"state = {_toml_str(paths.containerd_state)}",
        "disabled_plugins = [\"io.containerd.snapshotter.v1.btrfs\", "
        "\"io.containerd.snapshotter.v1.zfs\", \"io.containerd.snapshotter.v1.devmapper\", "
        "\"io.containerd.snapshotter.v1.erofs\", \"io.containerd.tracing.processor.v1.otlp\"]",
        "",
        "[grpc]",
        f"  address = {_toml_str(paths.containerd_socket)}",
        "",
        f"[{runtime}]",
        "  restrict_oom_score_adj = true",
        "  enable_selinux = false",
        f"  cdi_spec_dirs = [{_toml_str(paths.cdi_dir)}]",
        f"[{runtime}.containerd]",
        "  default_runtime_name = \"runc\"",
        f"[{runtime}.containerd.runtimes.runc]",
        "  runtime_type = \"io.containerd.runc.v2\"",
        f"[{runtime}.containerd.runtimes.runc.options]",
        "  SystemdCgroup = false",
        f"[{runtime}.cni]",
        f"  bin_dirs = [{_toml_str(paths.cni_bin)}]",
        f"  conf_dir = {_toml_str(paths.cni_conf)}",
        "  max_conf_num = 1",
        "",
        '[plugins."io.containerd.cri.v1.images"]',
        "  snapshotter = \"overlayfs\"",
        '[plugins."io.containerd.cri.v1.images".pinned_images]',
        f"  sandbox = {_toml_str(sandbox_image)}",
        "",
        '[plugins."io.containerd.grpc.v1.cri"]',
        "  stream_server_address = \"127.0.0.1\"",
        "  stream_server_port = \"0\"",
        "",
    ])


def kubelet_config(paths: RealNodePaths, *, port: int, healthz_port: int,
                   ca_file: Path, max_pods: int = 32,
                   taints: Sequence[Mapping[str, str]] = ()) -> dict[str, Any]:
    """KubeletConfiguration for a loopback-only node on a cgroup v1 or v2 machine without
    systemd. Authentication: client certificates of the cluster CA, and anonymous requests,
    which authorization allows (`AlwaysAllow`): the port listens on 127.0.0.1 only, and the
    dev apiserver calls it (`kubectl logs`) without a client certificate."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": True},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        # No systemd here; cgroup v1 (hybrid) machines are refused by default since 1.35.
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "cgroupRoot": f"/{CGROUP_ROOT}",
        "failSwapOn": False,
        "resolvConf": str(paths.resolv_conf),
        "maxPods": max_pods,
        # The dev machine's disk is shared and may be fuller than a node's: evict late, and
        # never garbage-collect the locally built images (they cannot be pulled again).
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "makeIPTablesUtilChains": False,
        "staticPodPath": "",
        "nodeStatusUpdateFrequency": "2s",
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "20s",
        "shutdownGracePeriod": "0s",
        "logging": {"format": "text"},
        "registerWithTaints": [dict(t) for t in taints],
    }


def cni_conflist(paths: RealNodePaths) -> dict[str, Any]:
    """The one CNI network: our plugin (`cni_plugin.py`), addresses of `POD_SUBNET`."""
    return {"cniVersion": "1.0.0", "name": CNI_NETWORK,
            "plugins": [{"type": CNI_NETWORK, "subnet": POD_SUBNET,
                         "dataDir": str(paths.cni_state)}]}
