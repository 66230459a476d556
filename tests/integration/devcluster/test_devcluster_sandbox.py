"""`egpu sandbox` as a user runs it: separate commands, processes that outlive them."""

from __future__ import annotations

import json
import time

import pytest

from egpu_testing.sandbox import alive, egpu, kubectl

pytestmark = pytest.mark.integration


POD = {
    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train"},
    "spec": {"containers": [{"name": "main", "image": "cuda:fake",
                             "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
}


def _wait_pods(kc, selector: str, count: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    names: list[str] = []
    while time.monotonic() < deadline:
        names = kubectl(kc, "get", "pods", "-l", selector, "-o", "name").split()
        if len(names) == count:
            return
        time.sleep(0.3)
    raise AssertionError(f"pods {selector}: {names}, expected {count}")


def test_sandbox_without_controller_manager_runs_none(tmp_path):
    state, kc = tmp_path / "state", tmp_path / "kubeconfig"
    up = egpu("sandbox", "up", "--gpu-nodes", "1", "--no-controller-manager",
              "--kubeconfig", str(kc), "--state-dir", str(state))
    assert up.returncode == 0, up.stderr + up.stdout
    try:
        recorded = json.loads((state / "state.json").read_text())["plane"]
        assert "kube-controller-manager" not in {p["name"] for p in recorded["processes"]}
        # Nothing makes the Deployment's ReplicaSet; a pod is admitted without a
        # ServiceAccount (the admission plugin is off with the controller manager).
        kubectl(kc, "create", "deployment", "web", "--image=x")
        kubectl(kc, "apply", "-f", "-", input=json.dumps(POD))
        time.sleep(2)
        assert kubectl(kc, "get", "replicasets", "-o", "name").strip() == ""
        pod = json.loads(kubectl(kc, "get", "pod", "train", "-o", "json"))
        assert "serviceAccountName" not in pod["spec"]
    finally:
        down = egpu("sandbox", "down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr


def test_sandbox_runs_gpu_pods_and_down_leaves_nothing(tmp_path):
    state, kc = tmp_path / "state", tmp_path / "kubeconfig"
    up = egpu("sandbox", "up", "--gpu-nodes", "3", "--gpus-per-node", "4", "--gpu-memory",
              "24576", "--kubeconfig", str(kc), "--state-dir", str(state))
    assert up.returncode == 0, up.stderr + up.stdout
    saved = json.loads((state / "state.json").read_text())
    recorded = saved["plane"]
    pids = [p["pid"] for p in recorded["processes"]]
    try:
        assert {p["name"] for p in recorded["processes"]} == {
            "etcd", "kube-apiserver", "kube-controller-manager", "egpu-scheduler",
            "egpu-webhook", "egpu-controller", "kube-scheduler", "kwok", "allocation-sync"}
        # The components outlived the `up` command.
        assert all(alive(pid) for pid in pids)

        status = egpu("sandbox", "status", "--json", "--state-dir", str(state))
        assert status.returncode == 0, status.stderr
        info = json.loads(status.stdout)
        assert info["running"] and info["nodes_ready"] == 3
        assert info["components"]["kube-controller-manager"]["alive"]

        node = json.loads(kubectl(kc, "get", "node", "gpu-node-000", "-o", "json"))
        alloc = node["status"]["allocatable"]
        assert alloc["nvidia.com/gpu"] == "4"
        assert alloc["elasticgpu.io/gpu-core"] == "400"
        assert alloc["elasticgpu.io/gpu-memory"] == str(4 * 24576)

        kubectl(kc, "apply", "-f", "-", input=json.dumps(POD))
        deadline = time.monotonic() + 30
        pod: dict = {}
        while time.monotonic() < deadline:
            pod = json.loads(kubectl(kc, "get", "pod", "train", "-o", "json"))
            if pod["status"].get("phase") == "Running":
                break
            time.sleep(0.2)
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["nodeName"].startswith("gpu-node-")

        # A pod holding a scheduler assignment shows up in its card's allocation columns,
        # although no agent runs on kwok nodes: the sandbox's allocation sync keeps them.
        share = json.loads(json.dumps(POD))
        share["metadata"] = {"name": "share", "annotations": {
            "elasticgpu.io/assignment": json.dumps({"v": 1, "node": "gpu-node-001", "containers": {
                "main": [{"index": 2, "uuid": "GPU-fake-gpu-node-001-2", "milli": 300,
                          "memoryMiB": 4096}]}}),
            "elasticgpu.io/assigned-node": "gpu-node-001"}}
        share["spec"]["nodeName"] = "gpu-node-001"
        share["spec"]["containers"][0]["resources"] = {}
        kubectl(kc, "apply", "-f", "-", input=json.dumps(share))
        deadline = time.monotonic() + 30
        card: dict = {}
        while time.monotonic() < deadline:
            card = json.loads(kubectl(kc, "get", "gpudevice", "gpu-node-001-gpu2", "-o", "json"))
            if card.get("status", {}).get("allocatedMilli"):
                break
            time.sleep(0.3)
        assert card["status"]["allocatedMilli"] == 300
        assert card["status"]["allocatedMemoryMiB"] == 4096
        # The same process samples the kwok nodes' fake usage model (agent.usage.fake_sync):
        # every card has its observed usage (the first sample writes every card at once).
        deadline = time.monotonic() + 30
        while "usage" not in card.get("status", {}) and time.monotonic() < deadline:
            time.sleep(0.3)
            card = json.loads(kubectl(kc, "get", "gpudevice", "gpu-node-001-gpu2", "-o", "json"))
        assert card["status"]["usage"]["outOfBandMemoryMiB"] == 0

        # The controller manager runs: a Deployment makes its pods, and deleting it deletes
        # them (garbage collector).
        kubectl(kc, "create", "deployment", "web", "--image=x", "--replicas=2")
        _wait_pods(kc, "app=web", 2)
        kubectl(kc, "delete", "deployment", "web", "--wait=false")
        _wait_pods(kc, "app=web", 0)

        again = egpu("sandbox", "up", "--gpu-nodes", "1", "--kubeconfig", str(kc),
                     "--state-dir", str(state))
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        down = egpu("sandbox", "down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr
    assert "kube-apiserver" in down.stdout
    assert not [pid for pid in pids if alive(pid)]
    assert not (state / "state.json").exists() and not (state / "cluster").exists()
    assert not kc.exists()
    assert egpu("sandbox", "status", "--state-dir", str(state)).returncode == 1


def test_sandbox_nodes_from_a_trace_node_list(tmp_path):
    csv = tmp_path / "nodes.csv"
    csv.write_text("sn,cpu_milli,memory_mib,gpu,model\n"
                   "openb-node-0000,32000,262144,0,\n"
                   "openb-node-0001,64000,262144,2,T4\n"
                   "openb-node-0002,96000,786432,8,V100M32\n"
                   "openb-node-0003,96000,786432,8,G2\n")
    sched = tmp_path / "sched.yaml"
    sched.write_text("apiVersion: kubescheduler.config.k8s.io/v1\n"
                     "kind: KubeSchedulerConfiguration\n"
                     "profiles:\n- schedulerName: egpu-sandbox-test\n")
    state, kc = tmp_path / "state", tmp_path / "kc"
    up = egpu("sandbox", "up", "--nodes-csv", str(csv), "--gpu-nodes", "2", "--kubeconfig",
              str(kc), "--state-dir", str(state), "--scheduler-config", str(sched))
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        # The sandbox's scheduler runs the given configuration: it serves that name.
        pod = json.loads(json.dumps(POD))
        pod["spec"]["schedulerName"] = "egpu-sandbox-test"
        pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "8"
        kubectl(kc, "apply", "-f", "-", input=json.dumps(pod))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            bound = json.loads(kubectl(kc, "get", "pod", "train", "-o", "json"))
            if bound["spec"].get("nodeName"):
                break
            time.sleep(0.2)
        assert bound["spec"].get("nodeName") == "openb-node-0002"  # the only one with 8
        nodes = json.loads(kubectl(kc, "get", "nodes", "-o", "json"))["items"]
        by_name = {n["metadata"]["name"]: n for n in nodes}
        assert sorted(by_name) == ["openb-node-0001", "openb-node-0002"]
        v100 = by_name["openb-node-0002"]
        assert v100["status"]["capacity"]["cpu"] == "96"
        assert v100["status"]["capacity"]["elasticgpu.io/gpu-memory"] == str(8 * 32768)
        assert v100["metadata"]["labels"]["nvidia.com/gpu.product"] == "V100M32"
    finally:
        assert egpu("sandbox", "down", "--state-dir", str(state)).returncode == 0


def test_a_dead_sandbox_is_reported_and_replaced_by_the_next_up(tmp_path):
    import os
    import signal

    state, kc = tmp_path / "state", tmp_path / "kc"
    args = ("--kubeconfig", str(kc), "--state-dir", str(state))
    assert egpu("sandbox", "up", "--gpu-nodes", "1", *args).returncode == 0
    first = json.loads((state / "state.json").read_text())["plane"]
    try:
        # As after a reboot or an OOM kill: every component gone, the state file left.
        for proc in first["processes"]:
            os.killpg(proc["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(alive(p["pid"]) for p in first["processes"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        status = egpu("sandbox", "status", "--state-dir", str(state))
        # etcd, apiserver, extender, webhook, egpu controller, controller manager, scheduler,
        # kwok, allocation sync
        assert len(first["processes"]) == 9
        assert status.returncode == 1 and status.stdout.count("DEAD") == 9

        again = egpu("sandbox", "up", "--gpu-nodes", "2", *args)
        assert again.returncode == 0, again.stderr
        second = json.loads((state / "state.json").read_text())["plane"]
        assert all(alive(p["pid"]) for p in second["processes"])
        assert len(json.loads(kubectl(kc, "get", "nodes", "-o", "json"))["items"]) == 2
    finally:
        assert egpu("sandbox", "down", "--state-dir", str(state)).returncode == 0
