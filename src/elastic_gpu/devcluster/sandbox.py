"""The sandbox: a control plane whose processes outlive the command that started it.

State lives in one directory: `state.json` (pids, ports, paths) and `cluster/` (certificates,
etcd data, logs). `up` refuses to start over a live sandbox; `down` stops the recorded
process groups, checks their ports are closed, and removes the directory.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic_gpu.core.model import Node
from elastic_gpu.devcluster import realnode_sandbox
from elastic_gpu.devcluster.binaries import find_bin_dir
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.errors import DevClusterError
from elastic_gpu.devcluster.nodes import FAKE_NODE_LABEL, AgentConfigLike, register_fake_nodes
from elastic_gpu.devcluster.ports import is_listening

STATE_FILE = "state.json"
ALLOCATION_SYNC = "allocation-sync"


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "elastic-gpu" / "sandbox"


@dataclass
class Sandbox:
    state_dir: Path
    plane: ControlPlane
    kubeconfig: Path
    node_names: list[str]

    def save(self) -> None:
        data = {"plane": self.plane.to_dict(), "kubeconfig": str(self.kubeconfig),
                "node_names": self.node_names}
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
                       Path(data["kubeconfig"]), [str(n) for n in data["node_names"]])
        except (ValueError, KeyError, TypeError) as err:
            raise DevClusterError(f"{path} is not a sandbox state file ({err}); remove "
                                  f"{state_dir} if no sandbox processes are left") from None


def count_ready_nodes(client: Any) -> tuple[int, int]:
    """(ready, total) among the sandbox's fake nodes."""
    from lightkube.resources.core_v1 import Node as K8sNode

    ready = total = 0
    for node in client.list(K8sNode, labels={FAKE_NODE_LABEL: "true"}):
        total += 1
        conditions = (node.status.conditions or []) if node.status else []
        if any(c.type == "Ready" and c.status == "True" for c in conditions):
            ready += 1
    return ready, total


def wait_nodes_ready(client: Any, expected: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    ready = total = 0
    while time.monotonic() < deadline:
        ready, total = count_ready_nodes(client)
        if ready >= expected:
            return
        time.sleep(0.2)
    raise DevClusterError(f"only {ready} of {expected} fake nodes became Ready within "
                          f"{timeout_s:.0f} s ({total} registered); see the kwok log")


def up(state_dir: Path, kubeconfig: Path, inventories: Sequence[Node], *,
       bin_dir: Path | None = None, timeout_s: float = 120.0,
       scheduler_config: Mapping[str, Any] | None = None,
       agent_config: AgentConfigLike | None = None,
       agent_configs: Mapping[str, AgentConfigLike] | None = None,
       controller_manager: bool = True, real_nodes: int = 0) -> Sandbox:
    """Start a sandbox with `inventories` as fake GPU nodes, Ready, and its kubeconfig.

    `scheduler_config`: a KubeSchedulerConfiguration for the sandbox's kube-scheduler (e.g.
    one that calls the Elastic GPU extender); connection and leader election are filled in.
    `agent_configs` (per node name), else `agent_config`: how each node's agent publishes it
    (resource names, time-slicing replicas, MIG strategy; see `nodes.register_fake_node`).
    `controller_manager`: run kube-controller-manager (Deployments, Jobs, garbage collection,
    namespace deletion, ResourceQuota, ServiceAccounts).
    `real_nodes`: 0 or 1 real kubelet nodes (containerd, runc; `realnode_sandbox`) beside the
    fake ones, each with an agent (fake backend).
    """
    existing = Sandbox.load(state_dir)
    if existing is not None:
        if any(existing.plane.alive().values()):
            raise DevClusterError(f"a sandbox is already running (state in {state_dir}); "
                                  "run `egpu sandbox down` first")
        _remove(existing)  # leftovers of a sandbox that died (e.g. a reboot)
    bins = find_bin_dir(bin_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    plane = ControlPlane(work_dir=state_dir / "cluster", bin_dir=bins)
    sandbox = Sandbox(state_dir, plane, kubeconfig.resolve(), [inv.name for inv in inventories])
    # Record every pid as soon as it exists: if this command is killed half-way, `down`
    # still finds what it had started.
    plane.on_spawn = lambda _plane: sandbox.save()
    try:
        plane.start(scheduler=scheduler_config or True, kwok_enabled=True,
                    controller_manager=controller_manager, timeout_s=timeout_s)
        sandbox.save()
        kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(plane.kubeconfig, kubeconfig)
        kubeconfig.chmod(0o600)
        client = plane.client()
        register_fake_nodes(client, inventories, agent_config=agent_config,
                            agent_configs=agent_configs)
        wait_nodes_ready(client, len(inventories), timeout_s)
        # kwok nodes have no agent to keep their cards' allocation columns current.
        plane.start_process(ALLOCATION_SYNC, [
            sys.executable, "-m", "elastic_gpu.devcluster.allocation_sync",
            "--kubeconfig", str(plane.kubeconfig)])
        realnode_sandbox.up(state_dir, plane, real_nodes, timeout_s=timeout_s)
    except BaseException:
        _remove(sandbox)
        raise
    return sandbox


def status(state_dir: Path) -> dict[str, Any]:
    """What is running: components (alive or not), ports, nodes Ready."""
    sandbox = Sandbox.load(state_dir)
    if sandbox is None:
        return {"running": False, "state_dir": str(state_dir)}
    alive = sandbox.plane.alive()
    result: dict[str, Any] = {
        "running": all(alive.values()),
        "state_dir": str(state_dir),
        "kubeconfig": str(sandbox.kubeconfig),
        "server": sandbox.plane.server,
        "components": {name: {"pid": p.pid, "alive": alive[name], "log": str(p.log_path)}
                       for name, p in sandbox.plane.processes.items()},
        "nodes_expected": len(sandbox.node_names),
    }
    real = realnode_sandbox.status(state_dir, sandbox.plane)
    if real:
        result["real_nodes"] = real
        result["running"] = result["running"] and all(
            c["alive"] for node in real for c in node["components"].values())
    if alive.get("kube-apiserver"):
        try:
            ready, total = count_ready_nodes(sandbox.plane.client())
        except Exception as err:  # status must report, not crash, when the API misbehaves
            result["nodes_error"] = f"{type(err).__name__}: {err}"
        else:
            result["nodes_ready"] = ready
            result["nodes_registered"] = total
    return result


def down(state_dir: Path) -> list[str]:
    """Stop the sandbox; return the names of the components that were stopped."""
    sandbox = Sandbox.load(state_dir)
    if sandbox is None:
        return []
    names = [name for name, alive in sandbox.plane.alive().items() if alive]
    names += realnode_sandbox.running(state_dir, sandbox.plane)
    _remove(sandbox)
    return names


def _remove(sandbox: Sandbox) -> None:
    plane = sandbox.plane
    # Only the ports of components that were running are ours to check: a dead component's
    # port may since have been taken by an unrelated program.
    ours = [port for name, alive in plane.alive().items() if alive
            for port in plane.ports_of(name) if port]
    real_error = None
    try:
        realnode_sandbox.down(sandbox.state_dir, plane)  # before its apiserver goes
    except DevClusterError as err:
        real_error = err
    plane.stop()
    if real_error is not None:
        raise real_error
    still = [port for port in ours if is_listening(port)]
    if still:
        raise DevClusterError(f"sandbox stopped but ports {still} still accept connections")
    # The kubeconfig we copied out names a CA that no longer exists: remove it if untouched.
    written = plane.kubeconfig
    if (sandbox.kubeconfig.exists() and written.exists()
            and sandbox.kubeconfig.read_bytes() == written.read_bytes()):
        sandbox.kubeconfig.unlink()
    shutil.rmtree(sandbox.state_dir / "cluster", ignore_errors=True)
    (sandbox.state_dir / STATE_FILE).unlink(missing_ok=True)
