"""`egpu sandbox up --real-nodes 1` and `down`: the real node beside the kwok nodes runs
busybox pods, and `down` leaves no process, mount, cgroup, netns, port or containerd state.

Skipped where the machine cannot run a real node (the reason is in the skip message).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing import sandbox as cli
from egpu_testing.realnode_pytest import skip_unless_real_node_possible
from egpu_testing.sandbox import alive, kubectl
from elastic_gpu.devcluster.binaries import find_bin_dir
from elastic_gpu.devcluster.realnode import (
    REAL_NODE_LABEL,
    REAL_NODE_TOLERATION,
    cgroup_pids,
    leftover_cgroups,
)
from elastic_gpu.devcluster.realnode_ns import lock_holder

pytestmark = pytest.mark.integration

#: Host paths a careless real node would create or fill.
HOST_PATHS = ("/run/netns", "/run/containerd", "/var/lib/kubelet", "/var/lib/cni",
              "/var/log/pods", "/var/log/containers", "/opt/containerd", "/etc/cni")


egpu = functools.partial(cli.egpu, timeout=240)


def host_mounts() -> list[str]:
    return [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]


def netns_count() -> int:
    """Network namespaces of live processes (a leaked pod netns would hold a process or a
    mount; both are checked too)."""
    seen = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                seen.add(os.readlink(proc / "ns" / "net"))
            except OSError:
                continue
    return len(seen)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    skip_unless_real_node_possible(find_bin_dir())
    # Short: sockets live under it (107-byte limit).
    path = Path(tempfile.mkdtemp(prefix="egpu-sb-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_sandbox_real_node_runs_pods_and_down_leaves_nothing(state_dir: Path) -> None:
    kc = state_dir / "kubeconfig"
    state = state_dir / "state"
    mounts_before = host_mounts()
    present_before = {p for p in HOST_PATHS if os.path.exists(p)}
    netns_before = netns_count()
    up = egpu("sandbox", "up", "--gpu-nodes", "1", "--real-nodes", "1",
              "--kubeconfig", str(kc), "--state-dir", str(state))
    pids: set[int] = set()
    ports: list[int] = []
    try:
        if up.returncode != 0 and "one per machine" in up.stderr + up.stdout:
            # another run's node took the machine after the fixture's check (between its
            # modules): the same skip the `real_node` fixture gives
            pytest.skip(f"this machine's one real node is taken: {up.stderr.strip()[-300:]}")
        assert up.returncode == 0, up.stderr + up.stdout
        assert "1 real node(s)" in up.stdout
        (node,) = json.loads((state / "realnode.json").read_text())
        ports = [node["kubelet_port"], node["healthz_port"]]
        pids = {p["pid"] for p in node["processes"]}
        assert {p["name"] for p in node["processes"]} == {"namespace", "containerd", "kubelet"}
        nodes = json.loads(kubectl(kc, "get", "nodes", "-o", "json"))["items"]
        real = [n for n in nodes if n["metadata"]["labels"].get(REAL_NODE_LABEL) == "true"]
        assert [n["metadata"]["name"] for n in real] == [node["name"]]
        assert real[0]["status"]["capacity"]["nvidia.com/gpu"] == "2"  # its agent registered
        status = json.loads(egpu("sandbox", "status", "--json", "--state-dir",
                                 str(state)).stdout)
        assert status["real_nodes"][0]["ready"] is True
        assert f"agent-{node['name']}" in status["components"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bb"},
               "spec": {"nodeSelector": {REAL_NODE_LABEL: "true"},
                        "tolerations": [REAL_NODE_TOLERATION],
                        "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": "c", "image": node["busybox_image"],
                                        "imagePullPolicy": "Never",
                                        "command": ["sleep", "3600"]}]}}
        kubectl(kc, "apply", "-f", "-", input=json.dumps(pod))
        deadline = time.monotonic() + 60
        while kubectl(kc, "get", "pod", "bb", "-o", "jsonpath={.status.phase}") != "Running":
            assert time.monotonic() < deadline, kubectl(kc, "describe", "pod", "bb")
            time.sleep(0.2)
        pids |= cgroup_pids()  # the pod's processes, shims, containerd, kubelet
        assert len(pids) > 3
        assert netns_count() > netns_before  # the pod's own network namespace
        with socket.create_connection(("127.0.0.1", ports[0]), timeout=2):
            pass
    finally:
        down = egpu("sandbox", "down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr
    assert "egpu-real-0/kubelet" in down.stdout
    assert [p for p in pids if alive(p)] == []
    assert cgroup_pids() == set() and leftover_cgroups() == []
    assert host_mounts() == mounts_before  # every mount lived in the node's namespace
    assert {p for p in HOST_PATHS if os.path.exists(p)} == present_before
    assert netns_count() <= netns_before
    assert lock_holder() is None
    assert not (state / "rn").exists() and not (state / "realnode.json").exists()


def test_a_killed_node_is_swept_by_the_next_start(state_dir: Path, k8s_cluster: Any) -> None:
    """kubelet, containerd and the namespace SIGKILLed (as when the test run is killed): the
    shims and pods they detached survive; the next start removes them, and its stop leaves
    nothing."""
    import signal

    from elastic_gpu.devcluster.realnode import RealNode, RealNodeBusy

    first = RealNode("egpu-real-0", state_dir / "a", k8s_cluster, die_with_parent=True)
    try:
        first.start()
    except RealNodeBusy as err:  # another run's node took the machine after the check
        pytest.skip(f"this machine's one real node is taken: {err}")
    try:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "orphan"},
               "spec": {"tolerations": [REAL_NODE_TOLERATION], "nodeName": first.name,
                        "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": "c", "image": first.busybox_image,
                                        "imagePullPolicy": "Never",
                                        "command": ["sleep", "3600"]}]}}
        k8s_cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
        deadline = time.monotonic() + 60
        while k8s_cluster.kubectl("get", "pod", "orphan", "-o",
                                  "jsonpath={.status.phase}").stdout != "Running":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        for handle in first.processes.values():
            os.killpg(handle.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(h.alive() for h in first.processes.values()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        orphans = cgroup_pids()
        assert orphans, "shims and the pod outlive kubelet and containerd"
        assert lock_holder() is None  # the lock died with the namespace holder

        second = RealNode("egpu-real-0", state_dir / "b", k8s_cluster, die_with_parent=True)
        second.start()  # sweeps the first node's leftovers, then starts clean
        try:
            assert [p for p in orphans if alive(p)] == []
            assert second.ready()
        finally:
            second.stop(delete_node=True)
    finally:
        first.stop()
        k8s_cluster.kubectl("delete", "pod", "orphan", "--grace-period=0", "--force",
                            "--wait=false", check=False)
    assert cgroup_pids() == set() and leftover_cgroups() == []
    assert lock_holder() is None


def test_a_start_while_another_starts_touches_nothing(state_dir: Path, k8s_cluster: Any) -> None:
    """Two test runs on one machine: while one process starts (or stops) a real node, holding
    @egpu-realnode-start, another's start is refused as busy before it checks or sweeps
    anything (before the claim, both could find the machine free and the second's sweep killed
    the first's new namespace: exit -9), and its stop leaves the shared cgroup alone."""
    from elastic_gpu.devcluster.realnode import RealNode, RealNodeBusy
    from elastic_gpu.devcluster.realnode_ns import take_start_claim

    claim = take_start_claim()
    if claim is None:  # another run is starting its node right now
        pytest.skip("another process holds @egpu-realnode-start: this machine's real node is "
                    "being started or stopped by another run")
    try:
        node = RealNode("egpu-real-0", state_dir / "busy", k8s_cluster, die_with_parent=True)
        with pytest.raises(RealNodeBusy, match="being started or stopped"):
            node.start()
        assert node.processes == {} and not (state_dir / "busy").exists()
        assert take_start_claim() is None  # still ours: the refused start did not take it
    finally:
        claim.close()
    assert lock_holder() is None and leftover_cgroups() == []
