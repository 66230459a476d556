"""Isolation providers through a real kubelet (issue 28, must-shows: "the hami-core provider's
env and mounts checked through the real kubelet"; the MPS supervisor's Allocate refusal).

A real kubelet node (containerd, runc, a busybox container) whose agent (fake backend) runs in
`sharing.mode: hami-core` with a dummy file standing in for libvgpu.so. A pod asking for a
share is placed by the extender behind the real kube-scheduler; its container prints its
environment and reads the mounts from inside, and the test reads that from the pod's log. The
busybox is static, so the preloaded dummy is never loaded. Then the library goes missing and
the next pod's Allocate is refused with the reason, which kubelet reports on the pod.

The same for `mps` with the agent's own daemons: the `egpu agent` process starts a stand-in
MPS daemon per card (egpu_testing.mps_standin), a share's container gets its card's pipe
directory and the daemons' /dev/shm, a killed daemon that cannot start again makes the next
Allocate fail with the reason, and the daemons quit when the agent stops.

Skipped where the machine cannot run a real node (the `real_node` fixture says why).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.mps_standin import daemon_pid, kill_daemon, standin_binary
from egpu_testing.scenario import wait_extender_knows
from egpu_testing.workbench import ExtenderProcess, extender_kube_scheduler_config
from elastic_gpu.api.gpudevice import object_name
from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.ports import free_ports
from elastic_gpu.devcluster.process import ProcessHandle, spawn
from elastic_gpu.devcluster.realnode import REAL_NODE_TOLERATION, RealNode
from elastic_gpu.devcluster.realnode_agent import agent_argv, write_agent_files

pytestmark = pytest.mark.integration

CORE = "elasticgpu.io/gpu-core"
MEMORY = "elasticgpu.io/gpu-memory"
LIBRARY_TEXT = "stand-in for libvgpu.so\n"
INVENTORY: dict[str, Any] = {
    "cards": [{"model": "A100-SXM4-80GB", "memoryMiB": 81920, "uuid": f"GPU-hami-{i}"}
              for i in range(2)]}
#: What the container prints: its environment, then what it sees through the mounts.
SCRIPT = ("env; echo '--'; cat /usr/local/vgpu/libvgpu.so; "
          "echo probe > /usr/local/vgpu/cache/probe && echo cache-writable; "
          "ls -d /tmp/vgpulock && echo lock-dir; exec sleep 3600")


@dataclass
class HamiNode:
    node: RealNode
    agent: ProcessHandle
    scheduler_name: str
    library: Path
    cache: Path


def wait_for(check: Callable[[], bool], what: str, agent: ProcessHandle,
             timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert agent.alive(), f"the agent died:\n{agent.log_tail()}"
        assert time.monotonic() < deadline, f"no {what} after {timeout_s:.0f} s; agent log:\n" \
            f"{agent.log_tail()}"
        time.sleep(0.2)


@pytest.fixture
def hami_node(real_node: RealNode, k8s_cluster: ControlPlane,
              start_kube_scheduler: Callable[..., Any], tmp_path: Path) -> Iterator[HamiNode]:
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd

    ensure_crd(k8s_cluster.kube())
    library = tmp_path / "vgpu" / "libvgpu.so"
    library.parent.mkdir()
    library.write_text(LIBRARY_TEXT)
    cache = tmp_path / "vgpu" / "containers"
    config = write_agent_files(tmp_path / "agent", real_node.device_plugin_dir, INVENTORY, {
        "resources": {"share": [CORE]}, "syncSeconds": 1,
        "sharing": {"mode": "hami-core", "hamiCore": {
            "library": str(library), "cacheDirectory": str(cache),
            "lockDirectory": str(tmp_path / "vgpulock")}}})
    agent = spawn("agent", agent_argv(real_node.name, k8s_cluster.kubeconfig, config),
                  tmp_path / "agent.log", die_with_parent=True)
    (port,) = free_ports(1)
    extender = ExtenderProcess(k8s_cluster.kubeconfig, port, tmp_path / "extender.log")
    try:
        extender.start()
        start_kube_scheduler(extender_kube_scheduler_config(extender.url,
                                                            extender.scheduler_name))
        wait_for(lambda: f"registered {CORE} with kubelet" in agent.log_path.read_text(),
                 "registration", agent)
        wait_extender_knows(extender.url, [real_node.name], len(INVENTORY["cards"]))
        yield HamiNode(real_node, agent, extender.scheduler_name, library, cache)
    finally:
        extender.stop()
        agent.stop()


def share_pod(name: str, scheduler: str, image: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": scheduler, "tolerations": [REAL_NODE_TOLERATION],
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": image,
                                     "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", SCRIPT],
                                     "resources": {"limits": {
                                         CORE: "30", NODE_CORE: "30", MEMORY: "4096"}}}]}}


def pod_json(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(plane.kubectl("get", "pod", name, "-n", namespace, "-o",
                                                   "json").stdout)
    return obj


def test_a_share_under_hami_core_gets_its_limits_and_mounts(
        hami_node: HamiNode, k8s_cluster: ControlPlane, k8s_namespace: str) -> None:
    plane = k8s_cluster
    plane.kubectl("apply", "-n", k8s_namespace, "-f", "-", input=json.dumps(share_pod(
        "shared", hami_node.scheduler_name, hami_node.node.busybox_image)))
    deadline = time.monotonic() + 90
    logs = ""
    while "lock-dir" not in logs:
        obj = pod_json(plane, k8s_namespace, "shared")
        assert obj["status"].get("phase") not in ("Failed", "Succeeded"), obj["status"]
        assert time.monotonic() < deadline, f"no output: {obj['status']}; log: {logs!r}; " \
            f"agent log:\n{hami_node.agent.log_tail()}"
        if obj["status"].get("phase") == "Running":
            logs = plane.kubectl("logs", "shared", "-n", k8s_namespace).stdout
        time.sleep(0.3)
    env_text, seen = logs.split("--\n", 1)
    env = dict(line.split("=", 1) for line in env_text.splitlines() if "=" in line)
    # The limits, as HAMi-core reads them, from Allocate's answer through the real kubelet.
    assert env["EGPU_ISOLATION"] == "hami-core"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == "/usr/local/vgpu/cache/vgpu.cache"
    assert env["LD_PRELOAD"] == "/usr/local/vgpu/libvgpu.so"
    assert "CUDA_DEVICE_MEMORY_LIMIT_1" not in env
    # The mounts, from inside: the operator's library (read-only), a cache directory of the
    # container's own (writable, on the host under cacheDirectory), the shared lock directory.
    assert seen.startswith(LIBRARY_TEXT)
    assert "cache-writable" in seen and "lock-dir" in seen
    (own,) = [d for d in hami_node.cache.iterdir() if d.is_dir()]
    assert (own / "probe").read_text() == "probe\n"

    # The library is gone from the node: the next share is refused at Allocate, with why.
    hami_node.library.unlink()
    plane.kubectl("apply", "-n", k8s_namespace, "-f", "-", input=json.dumps(share_pod(
        "refused", hami_node.scheduler_name, hami_node.node.busybox_image)))
    deadline = time.monotonic() + 90
    while True:
        obj = pod_json(plane, k8s_namespace, "refused")
        said = json.dumps(obj.get("status", {}))
        if "is not on this node" in said:
            break
        assert time.monotonic() < deadline, f"not refused: {obj.get('status')}"
        time.sleep(0.3)
    assert "libvgpu.so" in said and "refusing rather than giving a share" in said
    assert obj["status"].get("phase") == "Failed"


# -- mps with the agent's own daemons -----------------------------------------------------------

MPS_SCRIPT = ("env; echo '--'; ls $CUDA_MPS_PIPE_DIRECTORY; "
              "echo shm-$(cat /dev/shm/daemons-shm); exec sleep 3600")


def mps_pod(name: str, scheduler: str, image: str) -> dict[str, Any]:
    manifest = share_pod(name, scheduler, image)
    manifest["spec"]["containers"][0]["command"] = ["sh", "-c", MPS_SCRIPT]
    return manifest


def wait_pod_output(plane: ControlPlane, namespace: str, name: str, marker: str,
                    agent: ProcessHandle) -> str:
    deadline = time.monotonic() + 90
    logs = ""
    while marker not in logs:
        obj = pod_json(plane, namespace, name)
        assert obj["status"].get("phase") not in ("Failed", "Succeeded"), obj["status"]
        assert time.monotonic() < deadline, f"no output: {obj['status']}; log: {logs!r}; " \
            f"agent log:\n{agent.log_tail()}"
        if obj["status"].get("phase") == "Running":
            logs = plane.kubectl("logs", name, "-n", namespace).stdout
        time.sleep(0.3)
    return logs


def gpudevice_reason(plane: ControlPlane, node: str, index: int) -> str:
    out = plane.kubectl("get", "gpudevices", object_name(node, index), "-o", "json").stdout
    return str(json.loads(out).get("status", {}).get("reason", ""))


def reason_is(plane: ControlPlane, node: str, index: int,
              words: str | None) -> Callable[[], bool]:
    """The card's GPUDevice status.reason contains `words` (None: is empty)."""
    def check() -> bool:
        reason = gpudevice_reason(plane, node, index)
        return reason == "" if words is None else words in reason
    return check


def has_daemon(pipe: Path) -> Callable[[], bool]:
    return lambda: daemon_pid(pipe) is not None


def gone(pid: int) -> bool:
    """No such process, or a zombie its parent has yet to reap (a killed daemon runs in a
    session of its own, reparented: its reaper is not the agent)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def logged(agent: ProcessHandle, words: str) -> Callable[[], bool]:
    return lambda: words in agent.log_path.read_text()


def test_mps_daemons_run_by_the_agent_hold_and_refuse(
        real_node: RealNode, k8s_cluster: ControlPlane, k8s_namespace: str,
        start_kube_scheduler: Callable[..., Any], tmp_path: Path) -> None:
    from elastic_gpu.agent.deviceplugin.inventory_api import ensure_crd

    ensure_crd(k8s_cluster.kube())
    plane = k8s_cluster
    # Unix sockets live in the pipe directories: a short root (107 bytes at most).
    root = Path(tempfile.mkdtemp(prefix="mps", dir="/tmp"))
    pipes, shm = root / "pipe", root / "shm"
    shm.mkdir()
    (shm / "daemons-shm").write_text("shared\n")
    uuids = [card["uuid"] for card in INVENTORY["cards"]]
    config = write_agent_files(tmp_path / "agent", real_node.device_plugin_dir, INVENTORY, {
        "resources": {"share": [CORE]}, "syncSeconds": 1,
        "sharing": {"mode": "mps", "mps": {"pipeDirectory": str(pipes), "daemon": {
            "binary": str(standin_binary(root)), "logDirectory": str(root / "log"),
            "shmDirectory": str(shm), "checkSeconds": 0.2, "restartInitialSeconds": 0.2,
            "restartMaxSeconds": 0.2, "probeSeconds": 1, "probeTimeoutSeconds": 5}}}})
    agent = spawn("agent", agent_argv(real_node.name, plane.kubeconfig, config),
                  tmp_path / "agent.log", die_with_parent=True)
    (port,) = free_ports(1)
    extender = ExtenderProcess(plane.kubeconfig, port, tmp_path / "extender.log")
    try:
        extender.start()
        start_kube_scheduler(extender_kube_scheduler_config(extender.url,
                                                            extender.scheduler_name))
        wait_for(lambda: f"registered {CORE} with kubelet" in agent.log_path.read_text(),
                 "registration", agent)
        wait_extender_knows(extender.url, [real_node.name], len(uuids))
        # One daemon per card, started by the agent, each with its card only.
        for uuid in uuids:
            wait_for(has_daemon(pipes / uuid),
                     f"the MPS daemon of {uuid}", agent)
            assert (root / "log" / uuid / "control.log").read_text().endswith(f"for {uuid}\n")

        plane.kubectl("apply", "-n", k8s_namespace, "-f", "-", input=json.dumps(mps_pod(
            "mps-a", extender.scheduler_name, real_node.busybox_image)))
        logs = wait_pod_output(plane, k8s_namespace, "mps-a", "shm-", agent)
        env_text, seen = logs.split("--\n", 1)
        env = dict(line.split("=", 1) for line in env_text.splitlines() if "=" in line)
        assert env["EGPU_ISOLATION"] == "mps"
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipes)
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
        card = env["NVIDIA_VISIBLE_DEVICES"]
        # Inside: the card's own daemon's pipe directory (its control socket and pid file),
        # and the daemons' shared memory as /dev/shm.
        assert "control" in seen and "nvidia-cuda-mps-control.pid" in seen
        assert "shm-shared" in seen

        # The card's daemon dies and cannot start again: the next share on it is refused.
        other = next(u for u in uuids if u != card)
        (pipes / other / "refuse-start").touch()  # the other card too: the pod must wait
        (pipes / card / "refuse-start").touch()
        for uuid in uuids:
            kill_daemon(pipes / uuid)
        for uuid in uuids:  # the agent saw it: its restart failed
            wait_for(logged(agent, f"MPS control daemon of {uuid}: "),
                     f"the failed restart of {uuid}", agent)
        # The cards' GPUDevice status says why (the agent publishes it when a daemon goes).
        for index in range(len(uuids)):
            wait_for(reason_is(plane, real_node.name, index, "MPS control daemon down"),
                     f"the MPS reason on card {index}", agent)
        plane.kubectl("apply", "-n", k8s_namespace, "-f", "-", input=json.dumps(mps_pod(
            "mps-b", extender.scheduler_name, real_node.busybox_image)))
        deadline = time.monotonic() + 90
        while True:
            obj = pod_json(plane, k8s_namespace, "mps-b")
            said = json.dumps(obj.get("status", {}))
            if "MPS control daemon down" in said:
                break
            assert time.monotonic() < deadline, f"not refused: {obj.get('status')}; agent " \
                f"log:\n{agent.log_tail()}"
            time.sleep(0.3)
        assert "cannot start on this card" in said and "Allocate is refused" in said
        assert obj["status"].get("phase") == "Failed"

        # The cards recover: the agent starts their daemons again.
        for uuid in uuids:
            (pipes / uuid / "refuse-start").unlink()
        for uuid in uuids:
            wait_for(has_daemon(pipes / uuid),
                     f"the MPS daemon of {uuid} again", agent)
        for index in range(len(uuids)):
            wait_for(reason_is(plane, real_node.name, index, None),
                     f"card {index}'s reason cleared", agent)

        # A daemon that hangs (it runs, its socket accepts, it answers nothing) is found by the
        # agent's probe over its control pipe, killed and started again; while the card's
        # daemons keep hanging the card says so, and it recovers once they answer.
        hung_pid = daemon_pid(pipes / uuids[0])
        (pipes / uuids[0] / "hang").touch()
        wait_for(reason_is(plane, real_node.name, 0, "hung"), "the hung daemon's reason",
                 agent)
        assert hung_pid is not None and gone(hung_pid), "the hung daemon was not killed"
        assert "did not answer get_default_active_thread_percentage" in gpudevice_reason(
            plane, real_node.name, 0)
        (pipes / uuids[0] / "hang").unlink()
        wait_for(reason_is(plane, real_node.name, 0, None), "card 0 up again", agent)
        assert daemon_pid(pipes / uuids[0]) not in (None, hung_pid)
        pids = [daemon_pid(pipes / uuid) for uuid in uuids]
    finally:
        extender.stop()
        agent.stop()  # SIGTERM: the agent stops as it does in a pod
    # The agent stopped: it told its daemons to quit (they run in a session of their own,
    # so the agent's process group signal did not reach them).
    assert [daemon_pid(pipes / uuid) for uuid in uuids] == [None, None], pids
    shutil.rmtree(root, ignore_errors=True)
