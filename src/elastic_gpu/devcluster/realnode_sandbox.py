"""`egpu sandbox up --real-nodes 1`: the sandbox's real kubelet node and its agent.

State: `<state dir>/realnode.json` (written before anything starts, so a `down` after an
interrupted `up` still finds it) and the node's work dir `<state dir>/rn/`. The node's agent
runs the fake backend with `gpus` cards, as a component of the control plane
(`agent-<node>`), so `status` lists it; `down` stops it before the node.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.errors import DevClusterError
from elastic_gpu.devcluster.process import wait_ready
from elastic_gpu.devcluster.realnode import DEFAULT_NAME, RealNode
from elastic_gpu.devcluster.realnode_agent import agent_argv, default_inventory, write_agent_files

STATE_FILE = "realnode.json"
GPU_RESOURCE = "nvidia.com/gpu"  # the agent's default resources.gpu
MAX_REAL_NODES = 1


def _state_path(state_dir: Path) -> Path:
    return state_dir / STATE_FILE


def _save(state_dir: Path, nodes: list[RealNode]) -> None:
    tmp = state_dir / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps([n.to_dict() for n in nodes], indent=2))
    tmp.replace(_state_path(state_dir))


def load(state_dir: Path, plane: ControlPlane) -> list[RealNode]:
    path = _state_path(state_dir)
    if not path.exists():
        return []
    try:
        return [RealNode.from_dict(d, plane) for d in json.loads(path.read_text())]
    except (ValueError, KeyError, TypeError) as err:
        raise DevClusterError(f"{path} is not a real-node state file ({err})") from None


def preflight(count: int, bin_dir: Path | None = None) -> str | None:
    """Why `count` real nodes cannot start here (checked before anything starts), or None."""
    if count == 0:
        return None
    if count > MAX_REAL_NODES:
        return (f"at most {MAX_REAL_NODES} per machine (kubelet and containerd assume they own "
                "the machine: its cgroups, /dev/kmsg, the capacity they report)")
    from elastic_gpu.devcluster.binaries import find_bin_dir
    from elastic_gpu.devcluster.realnode import unavailable_reason
    from elastic_gpu.devcluster.realnode_ns import lock_holder

    reason = unavailable_reason(find_bin_dir(bin_dir))
    if reason is not None:
        return f"this machine cannot run a real node: {reason}"
    holder = lock_holder()
    if holder is not None:
        return (f"a real node already runs on this machine (pid {holder} holds the lock "
                "@egpu-realnode); one per machine")
    return None


def up(state_dir: Path, plane: ControlPlane, count: int, *, gpus: int = 2,
       model: str = "A100-SXM4-80GB", memory_mib: int = 81920,
       timeout_s: float = 120.0) -> list[RealNode]:
    """Start `count` (0 or 1) real nodes with their agents; Ready when this returns."""
    if count == 0:
        return []
    if count > MAX_REAL_NODES:
        raise DevClusterError(f"--real-nodes {count}: {preflight(count)}")
    from elastic_gpu.api import gpudevice
    from elastic_gpu.kube.crds import install_crds

    node = RealNode(DEFAULT_NAME, state_dir / "rn", plane,
                    on_spawn=lambda n: _save(state_dir, [n]))
    _save(state_dir, [node])
    node.start(timeout_s)
    install_crds(plane.kube(), [gpudevice.crd_manifest()])
    config = write_agent_files(state_dir / "rn-agent", node.device_plugin_dir,
                               default_inventory(gpus, model, memory_mib))
    agent = plane.start_process(f"agent-{node.name}",
                                agent_argv(node.name, plane.kubeconfig, config))

    def registered() -> bool:
        # The agent logs a registration only once kubelet accepted it; then the Node's
        # capacity counts the cards.
        try:
            if f"registered {GPU_RESOURCE} with kubelet" not in agent.log_path.read_text():
                return False
        except OSError:
            return False
        out = plane.kubectl("get", "node", node.name, "-o", "json", check=False).stdout
        capacity = json.loads(out or "{}").get("status", {}).get("capacity", {})
        return bool(capacity.get(GPU_RESOURCE) == str(gpus))

    wait_ready(agent, registered, timeout_s, interval_s=0.2)
    return [node]


def running(state_dir: Path, plane: ControlPlane) -> list[str]:
    """`<node>/<process>` of each real-node process that runs."""
    return [f"{node.name}/{name}" for node in load(state_dir, plane)
            for name, alive in node.alive().items() if alive]


def down(state_dir: Path, plane: ControlPlane) -> None:
    """Stop the sandbox's real nodes and their agents."""
    errors = []
    for node in load(state_dir, plane):
        # The agent first: it would serve its sockets again in the removed plugin directory.
        agent = plane.processes.get(f"agent-{node.name}")
        if agent is not None:
            agent.stop()
        try:
            node.stop()
        except DevClusterError as err:
            errors.append(str(err))
    _state_path(state_dir).unlink(missing_ok=True)
    for leftover in ("rn", "rn-agent"):
        path = state_dir / leftover
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
    if errors:
        raise DevClusterError("; ".join(errors))


def status(state_dir: Path, plane: ControlPlane) -> list[dict[str, Any]]:
    """Each real node: its processes (pid, alive, log) and whether its Node is Ready."""
    result = []
    for node in load(state_dir, plane):
        try:
            ready: bool | str = node.ready()
        except Exception as err:  # status reports, never crashes
            ready = f"{type(err).__name__}: {err}"
        result.append({"name": node.name, "ready": ready, "kubelet_port": node.kubelet_port,
                       "components": {name: {"pid": p.pid, "alive": p.alive(),
                                             "log": str(p.log_path)}
                                      for name, p in node.processes.items()}})
    return result
