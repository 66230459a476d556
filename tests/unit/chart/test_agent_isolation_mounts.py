"""The agent DaemonSet gets the host directories its isolation provider needs (docs/agent.md
"Isolation"), at the same paths, and nothing more: the default (accounting) renders none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from egpu_testing.chart import helm_template


def agent_pod(tmp_path: Path, sharing: dict[str, Any] | None) -> dict[str, Any]:
    values = {"agent.config.sharing": sharing} if sharing is not None else {}
    (daemonset,) = [d for d in helm_template(tmp_path, **values)
                    if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "elastic-gpu-agent"]
    spec: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return spec


def host_mounts(spec: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    (agent,) = spec["containers"]
    paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    return {m["mountPath"]: (paths[m["name"]], bool(m.get("readOnly")))
            for m in agent["volumeMounts"] if m["name"] in paths}


def driver_capabilities(spec: dict[str, Any]) -> str:
    (agent,) = spec["containers"]
    (value,) = [e["value"] for e in agent["env"] if e["name"] == "NVIDIA_DRIVER_CAPABILITIES"]
    return str(value)


def test_accounting_and_operator_run_mps_mount_nothing_more(tmp_path: Path) -> None:
    # The device-plugin sockets, and the kubelet's PodResources socket read-only (observed
    # usage: which container kubelet gave which device), in every mode.
    plugins = {"/var/lib/kubelet/device-plugins": ("/var/lib/kubelet/device-plugins", False),
               "/var/lib/kubelet/pod-resources": ("/var/lib/kubelet/pod-resources", True)}
    for sharing in (None, {"mode": "mps"}):
        spec = agent_pod(tmp_path, sharing)
        assert host_mounts(spec) == plugins
        assert driver_capabilities(spec) == "utility"


def test_the_agents_mps_daemons_get_pipes_logs_and_compute(tmp_path: Path) -> None:
    spec = agent_pod(tmp_path, {"mode": "mps", "mps": {
        "pipeDirectory": "/run/mps", "daemon": {"logDirectory": "/var/log/mps"}}})
    mounts = host_mounts(spec)
    assert mounts["/run/mps"] == ("/run/mps", False)
    assert mounts["/var/log/mps"] == ("/var/log/mps", False)
    assert mounts["/dev/shm"] == ("/run/egpu/mps/shm", False)  # shared with MPS clients
    assert driver_capabilities(spec) == "compute,utility"


def test_hami_core_gets_its_library_read_only_caches_and_locks(tmp_path: Path) -> None:
    mounts = host_mounts(agent_pod(tmp_path, {"mode": "hami-core"}))
    assert mounts["/usr/local/vgpu"] == ("/usr/local/vgpu", True)
    assert mounts["/usr/local/vgpu/containers"] == ("/usr/local/vgpu/containers", False)
    assert mounts["/tmp/vgpulock"] == ("/tmp/vgpulock", False)
