"""`egpu sandbox up` runs the whole Elastic GPU system by default (issue 13, must-show 1 and 5).

Driven through the real CLI as subprocesses, as a user would: the default `up` (only
--state-dir given, so the sandbox is the test's own; 4 nodes of 8 cards, the kubeconfig in the
state dir), a nano-gpu share Deployment bound with the
extender's assignment, garbage collection, a GPU ResourceQuota, `status`, and a `down` that
leaves no process, port, mount, cgroup or state behind.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from egpu_testing.sandbox import alive, egpu, kubectl, kubectl_run
from egpu_testing.seed import SEED_CLASS
from elastic_gpu.core.model import Node
from elastic_gpu.devcluster import components, sandbox
from elastic_gpu.devcluster.components import ComponentSpec, Role, Stage
from elastic_gpu.devcluster.errors import ComponentStartError
from elastic_gpu.devcluster.nodes import uniform_inventories

pytestmark = pytest.mark.integration

ASSIGNMENT = "elasticgpu.io/assignment"

#: The nano-gpu seed's manifest form: a share of one card in percent, as a limit.
NANO_DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: nano, labels: {app: nano}}
spec:
  replicas: 2
  selector: {matchLabels: {app: nano}}
  template:
    metadata: {labels: {app: nano}}
    spec:
      containers:
      - name: main
        image: cuda:fake
        resources:
          limits:
            nano-gpu/gpu-percent: "20"
"""


def _cgroups() -> set[str]:
    found: set[str] = set()
    for root, dirs, _files in os.walk("/sys/fs/cgroup"):
        found.update(os.path.join(root, d) for d in dirs)
    return found


def _mounts_under(path: Path) -> list[str]:
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [p for p in points if p == str(path) or p.startswith(str(path) + "/")]


def _group_members(pgids: set[int]) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] != "Z" and int(fields[2]) in pgids:
                members.append(int(entry.name))
    return members


def _cmdlines_naming(path: Path) -> dict[int, str]:
    inside = str(path).encode() + b"/"
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if inside in cmdline and alive(int(entry.name)):
                found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode()
    return found


def _pods(kc: Path, selector: str) -> list[dict]:
    return json.loads(kubectl(kc, "get", "pods", "-l", selector, "-o", "json"))["items"]


def _wait(what: str, check: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout_s:.0f} s")
        time.sleep(0.3)


def test_default_sandbox_runs_the_whole_system_and_down_leaves_nothing(tmp_path):
    state = tmp_path / "state"
    kc = state / "kubeconfig"  # where a plain `up` writes it
    cgroups_before = _cgroups()
    up = egpu("sandbox", "up", "--state-dir", str(state))
    assert up.returncode == 0, up.stderr + up.stdout
    assert "4 GPU node(s)" in up.stdout and str(kc) in up.stdout
    saved = json.loads((state / "state.json").read_text())
    processes = saved["plane"]["processes"]
    extender_url = saved["components"]["egpu-scheduler"]["endpoint"]
    try:
        names = [p["name"] for p in processes]
        # The extender is started (and ready) before the kube-scheduler that calls it.
        assert names.index("egpu-scheduler") < names.index("kube-scheduler")
        assert extender_url in up.stdout
        assert saved["components"]["egpu-webhook"]["endpoint"] in up.stdout
        config = yaml.safe_load((state / "cluster" / "kube-scheduler.yaml").read_text())
        assert [e["urlPrefix"] for e in config["extenders"]] == [extender_url]

        # status: every component with pid, state, endpoint and log; the nodes' readiness.
        status = egpu("sandbox", "status", "--json", "--state-dir", str(state))
        assert status.returncode == 0, status.stdout + status.stderr
        info = json.loads(status.stdout)
        assert info["running"] and not info["bare"]
        assert list(info["components"]) == names
        for proc in processes:
            comp = info["components"][proc["name"]]
            assert comp["pid"] == proc["pid"] and comp["state"] == "running"
            assert comp["log"] == proc["log_path"] and Path(comp["log"]).exists()
        assert info["components"]["egpu-scheduler"]["endpoint"] == extender_url
        # the kwok nodes' agent metrics, printed by `up` like the other endpoints
        sync_url = info["components"]["allocation-sync"]["endpoint"]
        assert sync_url.startswith("http://127.0.0.1:") and sync_url in up.stdout
        assert info["components"]["kube-apiserver"]["endpoint"] == info["server"]
        assert (info["nodes_ready"], info["nodes_registered"], info["nodes_expected"]) == (4, 4, 4)
        text = egpu("sandbox", "status", "--state-dir", str(state))
        assert text.returncode == 0
        for name, comp in info["components"].items():
            line = next(ln for ln in text.stdout.splitlines() if ln.split()[0] == name)
            assert str(comp["pid"]) in line and "running" in line and comp["log"] in line
            assert (comp["endpoint"] or "-") in line
        assert "nodes: 4 Ready, 4 registered, 4 expected" in text.stdout

        # The Elastic GPU API is installed at up (#15): the seed's class applies as written.
        kubectl(kc, "apply", "-f", "-", input=SEED_CLASS)
        listed = kubectl(kc, "get", "egpuclass,egpuc,egpu", "-A")
        assert "gpushare.provisioner.elasticgpu.io" in listed

        # Must-show 1: the nano seed's share Deployment gets pods bound with an assignment.
        kubectl(kc, "apply", "-f", "-", input=NANO_DEPLOYMENT)
        def running() -> list[dict]:
            pods = _pods(kc, "app=nano")
            done = [p for p in pods if p["status"].get("phase") == "Running"]
            return done if len(pods) == len(done) == 2 else []

        pods = _wait("2 nano pods Running", running)
        for pod in pods:
            assignment = json.loads(pod["metadata"]["annotations"][ASSIGNMENT])
            assert assignment["node"] == pod["spec"]["nodeName"]
            (card,) = assignment["containers"]["main"]
            assert card["milli"] == 200
        # Deleting the Deployment deletes its ReplicaSet and pods (garbage collector).
        kubectl(kc, "delete", "deployment", "nano", "--wait=false")
        _wait("nano pods deleted", lambda: not _pods(kc, "app=nano"))
        assert kubectl(kc, "get", "replicasets", "-o", "name").strip() == ""

        # Must-show 2 on the default sandbox: a quota on the share resource is enforced.
        kubectl(kc, "create", "namespace", "team")
        kubectl(kc, "apply", "-n", "team", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu"},
            "spec": {"hard": {"requests.nano-gpu/gpu-percent": "30"}}}))
        _wait("quota status", lambda: json.loads(kubectl(
            kc, "get", "-n", "team", "resourcequota", "gpu", "-o", "json")).get("status", {})
            .get("hard"))
        _wait("default ServiceAccount", lambda: "default" in kubectl(
            kc, "get", "-n", "team", "serviceaccounts", "-o", "name"))
        pod = yaml.safe_load(NANO_DEPLOYMENT)["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod", **pod}
        pod["metadata"] = {"name": "first"}
        kubectl(kc, "apply", "-n", "team", "-f", "-", input=json.dumps(pod))
        pod["metadata"] = {"name": "second"}
        refused = kubectl_run(kc, "apply", "-n", "team", "-f", "-", input=json.dumps(pod))
        assert refused.returncode != 0 and "exceeded quota" in refused.stderr
    finally:
        down = egpu("sandbox", "down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr + down.stdout
    # Nothing is left: no process (recorded pids, their groups, any command line naming the
    # state dir), no mount, no cgroup, no state, no kubeconfig.
    assert not [p["pid"] for p in processes if alive(p["pid"])]
    assert not _group_members({p["pid"] for p in processes})
    assert not _cmdlines_naming(state)
    assert not _mounts_under(tmp_path)
    assert not _cgroups() - cgroups_before
    assert not state.exists() or not list(state.iterdir())
    assert not kc.exists()


def test_bare_sandbox_is_kubernetes_alone(tmp_path):
    state, kc = tmp_path / "state", tmp_path / "kc"
    up = egpu("sandbox", "up", "--bare", "--gpu-nodes", "1", "--kubeconfig", str(kc),
              "--state-dir", str(state))
    assert up.returncode == 0, up.stderr + up.stdout
    try:
        saved = json.loads((state / "state.json").read_text())
        names = {p["name"] for p in saved["plane"]["processes"]}
        assert "egpu-scheduler" not in names and "allocation-sync" in names
        config = yaml.safe_load((state / "cluster" / "kube-scheduler.yaml").read_text())
        assert "extenders" not in config
        info = json.loads(egpu("sandbox", "status", "--json", "--state-dir", str(state)).stdout)
        assert info["bare"] and info["running"]
        # kube-scheduler alone counts nvidia.com/gpu itself and binds without an assignment.
        kubectl(kc, "apply", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "whole"},
            "spec": {"containers": [{"name": "main", "image": "x", "resources": {
                "limits": {"nvidia.com/gpu": "1"}}}]}}))
        def bound() -> dict | None:
            pod = json.loads(kubectl(kc, "get", "pod", "whole", "-o", "json"))
            return pod if pod["spec"].get("nodeName") else None

        pod = _wait("pod bound", bound)
        assert ASSIGNMENT not in (pod["metadata"].get("annotations") or {})
    finally:
        assert egpu("sandbox", "down", "--state-dir", str(state)).returncode == 0


def test_a_component_dying_during_up_fails_it_with_its_log_and_stops_the_rest(tmp_path):
    crash = ComponentSpec(
        name="crasher", role=Role.SYSTEM, stage=Stage.BEFORE_SCHEDULER,
        argv=lambda env: [env.python, "-c", "import sys, time; time.sleep(0.3); "
                          "print('crasher: lost its way', flush=True); sys.exit(3)"])
    state = tmp_path / "state"
    inventories: list[Node] = uniform_inventories(1)
    with pytest.raises(ComponentStartError) as caught:
        sandbox.up(state, tmp_path / "kc", inventories, timeout_s=60,
                   registry=(*components.REGISTRY, crash))
    # if another component fails first, say how (seen once beside a second suite: kwok)
    assert caught.value.name == "crasher", str(caught.value)
    assert "exit code 3" in str(caught.value) and "lost its way" in caught.value.log_tail
    assert not _cmdlines_naming(state)
    assert not (state / "state.json").exists()
    assert not (tmp_path / "kc").exists()
