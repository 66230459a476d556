"""On the real kubelet node (containerd, runc): a container's real processes are mapped to the
right pod and container through their cgroups, by the agent's own code (issue 28, must-show
"on the real kubelet node"). The fake backend's usage model reports the container's real PIDs
as GPU processes, so the mapping from PID to pod runs exactly as it does for NVML's processes.

Skipped where the machine cannot run a real node (the `real_node` fixture says why).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from elastic_gpu.agent.backends.base import Holder
from elastic_gpu.agent.backends.fake import USAGE_ANNOTATION, FakeBackend
from elastic_gpu.agent.devices import logical_cards
from elastic_gpu.agent.usage.cgroup import container_id, container_pids
from elastic_gpu.agent.usage.observe import container_ids, observe, proc_resolver
from elastic_gpu.core.usage import ContainerRef
from elastic_gpu.devcluster.controlplane import ControlPlane
from elastic_gpu.devcluster.realnode import REAL_NODE_TOLERATION, RealNode

pytestmark = pytest.mark.integration


def running_pod(plane: ControlPlane, namespace: str, node: RealNode, timeout_s: float = 90.0
                ) -> dict[str, Any]:
    """A pod of two containers on the real node (bound directly: no scheduler needed), the
    first running two processes; returned once both containers run."""
    use = json.dumps({"main": {"memoryMiB": 3000, "smPercent": 25}})
    manifest = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "observed", "annotations": {USAGE_ANNOTATION: use}},
                "spec": {"nodeName": node.name, "tolerations": [REAL_NODE_TOLERATION],
                         "terminationGracePeriodSeconds": 0,
                         "containers": [
                             {"name": "main", "image": node.busybox_image,
                              "imagePullPolicy": "Never",
                              "command": ["sh", "-c", "sleep 3600 & exec sleep 3601"]},
                             {"name": "side", "image": node.busybox_image,
                              "imagePullPolicy": "Never", "command": ["sleep", "3602"]}]}}
    plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))
    deadline = time.monotonic() + timeout_s
    while True:
        pod: dict[str, Any] = json.loads(plane.kubectl(
            "get", "pod", "observed", "-n", namespace, "-o", "json").stdout)
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        if len(statuses) == 2 and all("running" in (s.get("state") or {}) for s in statuses):
            return pod
        assert time.monotonic() < deadline, f"pod never ran: {pod.get('status')}"
        time.sleep(0.5)


def test_a_containers_real_processes_map_to_its_pod_and_container(
        real_node: RealNode, k8s_cluster: ControlPlane, k8s_namespace: str) -> None:
    pod = running_pod(k8s_cluster, k8s_namespace, real_node)
    ids = {s["name"]: container_id(s["containerID"]) for s in pod["status"]["containerStatuses"]}
    main = ContainerRef(k8s_namespace, "observed", "main")
    side = ContainerRef(k8s_namespace, "observed", "side")
    # Every process of the host, by its cgroup: each container's own.
    deadline = time.monotonic() + 10
    while len((pids := container_pids(Path("/proc"))).get(ids["main"], [])) < 2:
        assert time.monotonic() < deadline, f"main's two processes never seen: {pids}"
        time.sleep(0.2)
    assert len(pids[ids["side"]]) == 1
    resolve = proc_resolver([pod])
    assert {resolve(pid) for pid in pids[ids["main"]]} == {main}
    assert {resolve(pid) for pid in pids[ids["side"]]} == {side}
    assert container_ids([pod])[main] == (ids["main"],)

    # The fake backend's usage model reports main's real processes on its card, and the
    # agent's mapping names the holder from them (what the sampling loop does every sample).
    backend = FakeBackend.from_dict({"cards": [{"model": "A100", "memoryMiB": 40960}]},
                                    real_node.name)
    cards = logical_cards(backend.discover(), False)
    holder = Holder(cards[0].card.uuid, main, pod["metadata"]["annotations"], (ids["main"],))
    (sample,) = backend.sample([holder])
    assert sorted(p.pid for p in sample.processes) == pids[ids["main"]]
    assert all(p.owner is None for p in sample.processes)  # mapped by cgroup, not told
    usage = observe([sample], cards, {0: {main: 4096}}, resolve)
    assert [(c.pod, c.container, c.memory_mib, c.sm_percent)
            for c in usage[0].containers] == [("observed", "main", 3000, 25)]
    assert usage[0].out_of_band_mib == 0
