"""The MIG adapter on `egpu sandbox up --cluster` with MIG nodes (issue #16, must-shows 1-3).

The sandbox is the user's: the real CLI with a cluster file of seven A100-80GB nodes, each card
carved into a `1g.10gb` and a `2g.20gb` instance (and one node offering `3g.40gb`, which
only the advisor's pod names, pinned elsewhere); kube-apiserver, kube-controller-manager
(Deployments make pods), kube-scheduler calling `egpu scheduler`, `egpu webhook` and `egpu
controller` (claims + mig) as the sandbox runs them. Each test pins its pods to its own node
(nodeSelector), so the tests share the sandbox without sharing instances.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from egpu_testing.claims import elasticgpu_object
from egpu_testing.controller import ControllerProcess
from egpu_testing.sandbox import egpu, kubectl, kubectl_run
from egpu_testing.waiting import wait_for
from elastic_gpu.agent.config import AgentConfig
from elastic_gpu.agent.devices import logical_cards
from elastic_gpu.agent.grant import DeviceFiles, build_grant
from elastic_gpu.api import gpudevice
from elastic_gpu.core.assignment import Assignment, CardShare
from elastic_gpu.core.mig.rules import MIG_ORIGINAL, MIG_RETURNING, MIG_SUBSTITUTION
from elastic_gpu.core.nodefit import NODE_CORE
from elastic_gpu.core.quota import QUOTA_CORE, QUOTA_MEMORY, QUOTA_NAMES
from elastic_gpu.devcluster.ports import free_ports
from elastic_gpu.devcluster.sandbox import Sandbox

pytestmark = pytest.mark.integration

CLUSTER_FILE = """\
nodeGroups:
- name: mig
  count: 7
  gpus: 1
  model: A100-SXM4-80GB
  memoryMiB: 81920
  mig: [1g.10gb, 2g.20gb]
- name: big
  count: 1
  gpus: 1
  model: A100-SXM4-80GB
  memoryMiB: 81920
  mig: [3g.40gb]
"""
#: A move's deadline, generous for a loaded box: how fast moves are is bench/mig_moves.py's
#: to measure (no test asserts a duration).
MOVE_DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    where = tmp_path_factory.mktemp("migsb")
    (where / "cluster.yaml").write_text(CLUSTER_FILE)
    up = egpu("sandbox", "up", "--cluster", str(where / "cluster.yaml"), "--state-dir",
              str(where / "state"), "--kubeconfig", str(where / "kubeconfig"), timeout=300)
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        yield where
    finally:
        egpu("sandbox", "down", "--state-dir", str(where / "state"), timeout=120)


def kc(box: Path) -> Path:
    return box / "kubeconfig"


def get(box: Path, *what: str) -> Any:
    result = kubectl_run(kc(box), "get", *what, "-o", "json")
    if result.returncode != 0:
        return None
    return json.loads(result.stdout)


def pod_manifest(name: str, node: str, profile: str, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": name, "team": "ml"},
                         "annotations": {"note": "mine"}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                     "terminationGracePeriodSeconds": 0, **extra,
                     "containers": [{"name": "main", "image": "cuda:fake",
                                     "args": ["--epochs", "3"], "env": [{"name": "A", "value": "1"}],
                                     "resources": {"limits": {f"nvidia.com/mig-{profile}": "1"}}}]}}


def create(box: Path, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    """The object as created (the adapter may move a pod a moment later)."""
    out: dict[str, Any] = json.loads(kubectl(kc(box), "create", "-n", namespace, "-o", "json",
                                             "-f", "-", input=json.dumps(obj)))
    return out


def limits(pod: dict[str, Any]) -> dict[str, str]:
    """The container's limits but the quota's names (the sandbox's webhook adds them: `quota`)."""
    return {k: v for k, v in pod["spec"]["containers"][0]["resources"]["limits"].items()
            if k not in QUOTA_NAMES}


def quota(pod: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in pod["spec"]["containers"][0]["resources"]["limits"].items()
            if k in QUOTA_NAMES}


def on_profile(box: Path, namespace: str, name: str | None, profile: str,
               selector: str | None = None) -> dict[str, Any] | None:
    """The pod (by name, or the one of a label selector) once it is placed on `profile`."""
    if name is not None:
        pod = get(box, "pod", name, "-n", namespace)
        pods = [pod] if pod else []
    else:
        pods = (get(box, "pods", "-n", namespace, "-l", selector or "") or {}).get("items", [])
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp") or not pod["spec"].get("nodeName"):
            continue
        if f"nvidia.com/mig-{profile}" in limits(pod):
            return dict(pod)
    return None


def events(box: Path, namespace: str, reason: str) -> list[dict[str, Any]]:
    items = (get(box, "events", "-n", namespace) or {}).get("items", [])
    return [e for e in items if e.get("reason") == reason]


def rules(box: Path, namespace: str) -> list[dict[str, Any]]:
    return list((get(box, "migsub", "-n", namespace) or {}).get("items", []))


def instance_served(box: Path, pod: dict[str, Any], profile: str) -> str:
    """The extender's assignment names an instance of `profile` on the pod's node, and the
    agent's grant for it (the device plugin's Allocate answer) makes exactly that instance
    visible; returns the instance's uuid."""
    assignment = Assignment.from_json(pod["metadata"]["annotations"]["elasticgpu.io/assignment"])
    (share,) = tuple(assignment.shares())
    assert share.mig_profile == profile and share.mig_uuid
    devices = (get(box, "gpudevices") or {})["items"]
    (node,) = [n for n in gpudevice.nodes_from_objects(devices)
               if n.name == pod["spec"]["nodeName"]]
    profiles = {i.uuid: i.profile.name for c in node.cards for i in c.mig}
    assert profiles[share.mig_uuid] == profile
    cards = {lc.index: lc for lc in logical_cards(node.cards, False)}
    grant = build_grant([share], cards, AgentConfig(), "NVIDIA_VISIBLE_DEVICES",
                        DeviceFiles({c.uuid: ["/dev/nvidia0"] for c in node.cards}, []), None)
    assert grant.envs["NVIDIA_VISIBLE_DEVICES"] == share.mig_uuid
    assert grant.envs["EGPU_ISOLATION"] == "mig"
    return share.mig_uuid


@pytest.fixture
def namespace(box: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"mig-{request.node.name.split('[')[0][5:25].replace('_', '-').strip('-')}"
    kubectl(kc(box), "create", "namespace", name)
    wait_for("the default ServiceAccount", lambda: get(box, "sa", "default", "-n", name))
    yield name
    kubectl_run(kc(box), "delete", "namespace", name, "--wait=false")


def test_a_deployment_moves_to_2g_and_back_within_10s(box: Path, namespace: str) -> None:
    node = "mig-000"
    create(box, namespace, pod_manifest("blocker", node, "1g.10gb"))
    wait_for("the blocker on 1g.10gb", lambda: on_profile(box, namespace, "blocker", "1g.10gb"))
    template = pod_manifest("web", node, "1g.10gb")
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "web"},
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                           "template": {"metadata": template["metadata"] | {"name": None},
                                        "spec": template["spec"]}}}
    del deployment["spec"]["template"]["metadata"]["name"]
    create(box, namespace, deployment)
    moved = wait_for("the Deployment's pod on 2g.20gb", lambda: on_profile(
        box, namespace, None, "2g.20gb", "app=web"), timeout_s=MOVE_DEADLINE_S)
    notes = moved["metadata"]["annotations"]
    assert notes[MIG_ORIGINAL] == "main=1g.10gb"
    (rule,) = rules(box, namespace)
    assert notes[MIG_SUBSTITUTION] == rule["metadata"]["name"]
    assert rule["spec"]["fromProfile"] == "1g.10gb" and rule["spec"]["toProfile"] == "2g.20gb"
    assert "ownerUID" in rule["spec"]["selector"] and "savedPod" not in rule["spec"]
    served = instance_served(box, moved, "2g.20gb")
    assert served == "MIG-fake-mig-000-0-1"
    assert wait_for("the move's Events", lambda: events(box, namespace, "MIGSubstituted"))
    substituted = events(box, namespace, "MIGSubstituted")
    assert {e["involvedObject"]["kind"] for e in substituted} == {"Pod", "MIGSubstitution"}
    (deleted,) = [e["involvedObject"]["name"] for e in substituted
                  if e["involvedObject"]["kind"] == "Pod"]
    assert deleted != moved["metadata"]["name"]  # the moved pod is its owner's replacement

    kubectl(kc(box), "delete", "pod", "blocker", "-n", namespace, "--wait=false")
    back = wait_for("the Deployment's pod back on 1g.10gb", lambda: on_profile(
        box, namespace, None, "1g.10gb", "app=web"), timeout_s=MOVE_DEADLINE_S)
    assert MIG_ORIGINAL not in back["metadata"]["annotations"]
    assert instance_served(box, back, "1g.10gb") == "MIG-fake-mig-000-0-0"
    wait_for("the rule deleted", lambda: not rules(box, namespace), timeout_s=60)
    assert {e["involvedObject"]["kind"] for e in events(box, namespace, "MIGMovedBack")} == {
        "Pod", "MIGSubstitution"}
    time.sleep(2)  # nothing moves on: one pod, on its own profile
    pods = get(box, "pods", "-n", namespace, "-l", "app=web")["items"]
    assert [p["metadata"]["uid"] for p in pods] == [back["metadata"]["uid"]]


def test_a_bare_pod_moves_keeping_its_name_and_spec_and_back(box: Path, namespace: str) -> None:
    node = "mig-001"
    create(box, namespace, pod_manifest("blocker", node, "1g.10gb"))
    wait_for("the blocker on 1g.10gb", lambda: on_profile(box, namespace, "blocker", "1g.10gb"))
    original = create(box, namespace, pod_manifest("train", node, "1g.10gb"))
    moved = wait_for("train on 2g.20gb", lambda: on_profile(box, namespace, "train", "2g.20gb"),
                     timeout_s=MOVE_DEADLINE_S)
    assert moved["metadata"]["uid"] != original["metadata"]["uid"]
    assert moved["metadata"]["labels"] == original["metadata"]["labels"]
    (rule,) = rules(box, namespace)
    assert rule["spec"]["selector"] == {"podName": "train"}
    assert limits(rule["spec"]["savedPod"]) == {"nvidia.com/mig-1g.10gb": "1", NODE_CORE: "14"}
    assert rule["status"]["movedPods"][0]["uid"] == moved["metadata"]["uid"]
    notes = {k: v for k, v in moved["metadata"]["annotations"].items()
             if not k.startswith("elasticgpu.io/assign")}
    assert notes == {"note": "mine", MIG_ORIGINAL: "main=1g.10gb",
                     MIG_SUBSTITUTION: rule["metadata"]["name"]}
    was, now = original["spec"], moved["spec"]
    assert limits(moved) == {"nvidia.com/mig-2g.20gb": "1", NODE_CORE: "28"}  # recounted
    assert quota(moved) == {QUOTA_CORE: "29", QUOTA_MEMORY: "20480"}  # the quota too
    assert {k: v for k, v in now["containers"][0].items() if k != "resources"} == {
        k: v for k, v in was["containers"][0].items() if k != "resources"}
    assert {k: v for k, v in now.items() if k not in ("containers", "nodeName")} == {
        k: v for k, v in was.items() if k not in ("containers", "nodeName")}
    assert instance_served(box, moved, "2g.20gb") == "MIG-fake-mig-001-0-1"
    kinds = {(e["involvedObject"]["kind"], e["reason"]) for e in
             events(box, namespace, "MIGSubstituted") + events(box, namespace, "Recreated")}
    assert kinds == {("Pod", "MIGSubstituted"), ("MIGSubstitution", "MIGSubstituted"),
                     ("Pod", "Recreated"), ("MIGSubstitution", "Recreated")}

    kubectl(kc(box), "delete", "pod", "blocker", "-n", namespace, "--wait=false")
    back = wait_for("train back on 1g.10gb", lambda: on_profile(box, namespace, "train",
                                                                "1g.10gb"), timeout_s=MOVE_DEADLINE_S)
    assert back["metadata"]["labels"] == original["metadata"]["labels"]
    assert {k: v for k, v in back["metadata"]["annotations"].items()
            if not k.startswith("elasticgpu.io/assign")} == {"note": "mine"}
    assert back["spec"]["containers"][0] == original["spec"]["containers"][0]
    assert instance_served(box, back, "1g.10gb") == "MIG-fake-mig-001-0-0"
    wait_for("the rule deleted", lambda: not rules(box, namespace), timeout_s=60)


def test_no_compatible_profile_free_stays_pending_with_an_event(box: Path,
                                                                 namespace: str) -> None:
    node = "mig-002"
    create(box, namespace, pod_manifest("blocker", node, "2g.20gb"))
    wait_for("the blocker on 2g.20gb", lambda: on_profile(box, namespace, "blocker", "2g.20gb"))
    create(box, namespace, pod_manifest("big", node, "2g.20gb"))
    (event,) = wait_for("the Event saying why", lambda: [
        e for e in events(box, namespace, "NoCompatibleProfileFree")
        if e["involvedObject"]["name"] == "big"], timeout_s=60)
    assert event["type"] == "Warning"
    assert "no instance of 2g.20gb nor of a compatible profile" in event["message"]
    assert "at least 2 compute slices and 20 GB" in event["message"]
    time.sleep(2)
    pod = get(box, "pod", "big", "-n", namespace)
    assert not pod["spec"].get("nodeName") and limits(pod) == {"nvidia.com/mig-2g.20gb": "1",
                                                               NODE_CORE: "28"}
    assert rules(box, namespace) == []


def test_two_pending_and_one_free_compatible_exactly_one_moves(box: Path,
                                                               namespace: str) -> None:
    node = "mig-003"
    create(box, namespace, pod_manifest("blocker", node, "1g.10gb"))
    wait_for("the blocker on 1g.10gb", lambda: on_profile(box, namespace, "blocker", "1g.10gb"))
    for name in ("a", "b"):
        create(box, namespace, pod_manifest(name, node, "1g.10gb"))
    moved = wait_for("one pod on 2g.20gb", lambda: [
        p for p in ("a", "b") if on_profile(box, namespace, p, "2g.20gb")], timeout_s=60)
    (other,) = {"a", "b"} - set(moved)
    wait_for("the other's Event", lambda: [
        e for e in events(box, namespace, "NoCompatibleProfileFree")
        if e["involvedObject"]["name"] == other], timeout_s=60)
    time.sleep(3)  # and it stays so
    assert [p for p in ("a", "b") if on_profile(box, namespace, p, "2g.20gb")] == moved
    waiting = get(box, "pod", other, "-n", namespace)
    assert not waiting["spec"].get("nodeName")
    assert limits(waiting) == {"nvidia.com/mig-1g.10gb": "1", NODE_CORE: "14"}
    assert [r["spec"]["selector"] for r in rules(box, namespace)] == [{"podName": moved[0]}]


def test_an_instance_a_claim_holds_is_not_free(box: Path, namespace: str) -> None:
    # A static ElasticGPU (the claims issue) holds mig-006's 2g.20gb: with the 1g.10gb taken
    # too, a pod asking 1g.10gb has nothing to move to. Counting only pods, the adapter saw the
    # 2g.20gb free, moved the pod there, and the extender (which counts ElasticGPUs) left it
    # Pending under a rule.
    node = "mig-006"
    devices = (get(box, "gpudevices") or {})["items"]
    (card,) = [c for n in gpudevice.nodes_from_objects(devices) if n.name == node
               for c in n.cards]
    (two,) = [i for i in card.mig if i.profile.name == "2g.20gb"]
    held = CardShare(card.index, card.uuid, 0, 20 * 1024, "2g.20gb", two.uuid)
    name = f"held-{namespace}"
    kubectl(kc(box), "create", "-f", "-", input=json.dumps(elasticgpu_object(
        name, node, [held], capacity={"nvidia.com/mig-2g.20gb": 1})))
    try:
        create(box, namespace, pod_manifest("blocker", node, "1g.10gb"))
        wait_for("the blocker on 1g.10gb",
                 lambda: on_profile(box, namespace, "blocker", "1g.10gb"))
        create(box, namespace, pod_manifest("train", node, "1g.10gb"))
        (event,) = wait_for("the Event saying why", lambda: [
            e for e in events(box, namespace, "NoCompatibleProfileFree")
            if e["involvedObject"]["name"] == "train"], timeout_s=60)
        assert "no instance of 1g.10gb nor of a compatible profile" in event["message"]
        time.sleep(2)
        pod = get(box, "pod", "train", "-n", namespace)
        assert not pod["spec"].get("nodeName") and limits(pod) == {
            "nvidia.com/mig-1g.10gb": "1", NODE_CORE: "14"}
        assert rules(box, namespace) == []
    finally:
        kubectl_run(kc(box), "delete", "egpu", name, "--wait=false")


#: short Lease timings for the tests' own controllers (a SIGKILLed holder's Lease expires fast)
LEASE = (3.0, 2.0, 0.5)


def stop_sandbox_controller(box: Path) -> None:
    """SIGTERM the sandbox's `egpu controller` (it releases the Lease), so that a test's own
    controller leads."""
    state = Sandbox.load(box / "state")
    assert state is not None
    sandboxed = state.plane.processes["egpu-controller"]
    if sandboxed.alive():
        os.kill(sandboxed.pid, signal.SIGTERM)
    wait_for("the sandbox's controller to stop", lambda: not sandboxed.alive(), timeout_s=MOVE_DEADLINE_S)


class CrashingController(ControllerProcess):
    """`egpu controller --only mig` that SIGKILLs itself right after its first pod delete
    (tests/egpu_testing/mig_crash.py)."""

    def start(self, timeout_s: float = 60.0) -> None:
        import egpu_testing

        script = Path(egpu_testing.__file__).with_name("mig_crash.py")
        duration, deadline, retry = self.lease
        argv = [sys.executable, str(script),
                "--kubeconfig", str(self.kubeconfig), "--extender-url", self.extender_url,
                "--identity", self.identity, "--lease-name", self.lease_name,
                "--lease-namespace", self.lease_namespace, "--lease-duration", str(duration),
                "--renew-deadline", str(deadline), "--retry-period", str(retry),
                "--metrics-port", str(self.port), "--log-level", "DEBUG", *self.extra]
        self.starts += 1
        self.launch(argv, timeout_s, header=f"---- start {self.starts}: {' '.join(argv)}\n")


def test_sigkill_between_delete_and_recreate_loses_nothing(box: Path, namespace: str,
                                                           tmp_path: Path) -> None:
    node = "mig-004"
    stop_sandbox_controller(box)
    lease = LEASE
    crashing = CrashingController(kc(box), free_ports(1)[0], tmp_path / "crash.log",
                                  extender_url="http://127.0.0.1:1", identity="crashing",
                                  lease=lease, extra=("--only", "mig"))
    crashing.start()
    try:
        create(box, namespace, pod_manifest("blocker", node, "1g.10gb"))
        wait_for("the blocker on 1g.10gb",
                 lambda: on_profile(box, namespace, "blocker", "1g.10gb"))
        original = create(box, namespace, pod_manifest("train", node, "1g.10gb"))
        process = crashing.process
        assert process is not None
        wait_for("the controller killed after its delete", lambda: process.poll() is not None,
                 timeout_s=MOVE_DEADLINE_S)
    finally:
        crashing.stop()
    log = (tmp_path / "crash.log").read_text()
    assert f"mig_crash: deleted /api/v1/namespaces/{namespace}/pods/train" in log, log[-2000:]
    assert process.returncode == -signal.SIGKILL
    # deleted, not created again: gone, or still held by the budget keeper's finalizer (the
    # sandbox's webhook gives every GPU pod one, and no keeper runs until the restart)
    left = get(box, "pod", "train", "-n", namespace)
    assert left is None or (left["metadata"]["uid"] == original["metadata"]["uid"]
                            and left["metadata"].get("deletionTimestamp")), left
    (rule,) = rules(box, namespace)
    assert rule["spec"]["savedPod"]["metadata"]["name"] == "train"
    assert not (rule.get("status") or {}).get("movedPods")

    # the restarted controller is the whole one the sandbox runs, less claims: the MIG adapter
    # and the budget keeper, which releases the deleted pod so its name is free again
    restarted = ControllerProcess(kc(box), free_ports(1)[0], tmp_path / "restarted.log",
                                  extender_url="http://127.0.0.1:1", identity="restarted",
                                  lease=lease, extra=("--only", "mig", "--only", "budgets"))
    restarted.start()
    try:
        again = wait_for("train created again on 2g.20gb", lambda: on_profile(
            box, namespace, "train", "2g.20gb"), timeout_s=MOVE_DEADLINE_S)
        assert again["metadata"]["labels"] == original["metadata"]["labels"]
        assert {k: v for k, v in again["spec"]["containers"][0].items() if k != "resources"} \
            == {k: v for k, v in original["spec"]["containers"][0].items() if k != "resources"}
        assert [e for e in events(box, namespace, "Recreated")
                if "MIGSubstitution" in e["message"]]
        (rule,) = wait_for("the rule recording the pod", lambda: [
            r for r in rules(box, namespace) if (r.get("status") or {}).get("movedPods")])
        assert rule["status"]["movedPods"][0]["uid"] == again["metadata"]["uid"]
        assert "recovered" in restarted.metrics()
        # and the rule does not dangle: the pod goes back when its profile frees, rule gone
        kubectl(kc(box), "delete", "pod", "blocker", "-n", namespace, "--wait=false")
        wait_for("train back on 1g.10gb", lambda: on_profile(box, namespace, "train",
                                                             "1g.10gb"), timeout_s=MOVE_DEADLINE_S)
        wait_for("no rule left", lambda: not rules(box, namespace), timeout_s=60)
        assert MIG_RETURNING  # (the return went through the returning mark)
    finally:
        restarted.stop()


def test_the_recarve_advisor_says_which_layout_would_fit(box: Path, namespace: str,
                                                         tmp_path: Path) -> None:
    """`mig.recarveAdvice: true` in `egpu controller --config`: the Event of a pod no
    compatible instance can take names the re-carve that would fit it; nothing changes."""
    node = "mig-005"
    stop_sandbox_controller(box)
    config = tmp_path / "controller.yaml"
    config.write_text("mig:\n  recarveAdvice: true\n")
    controller = ControllerProcess(kc(box), free_ports(1)[0], tmp_path / "advisor.log",
                                   extender_url="http://127.0.0.1:1", identity="advisor",
                                   lease=LEASE, extra=("--only", "mig", "--config", str(config)))
    controller.start()
    try:
        create(box, namespace, pod_manifest("blocker", node, "2g.20gb"))
        wait_for("the blocker on 2g.20gb", lambda: on_profile(box, namespace, "blocker",
                                                               "2g.20gb"))
        before = get(box, "gpudevice", f"{node}-gpu0")["spec"]["mig"]
        create(box, namespace, pod_manifest("big", node, "3g.40gb"))
        (event,) = wait_for("the Event with the advice", lambda: [
            e for e in events(box, namespace, "NoCompatibleProfileFree")
            if e["involvedObject"]["name"] == "big"], timeout_s=60)
        # held 2g.20gb (2 of 7 compute, 2 of 8 memory slices) + free 1g.10gb: a 3g.40gb fits
        # beside both without destroying anything
        assert (f"dry run: card GPU-fake-{node}-0 on node {node} (A100-SXM4-80GB) could hold "
                "a 3g.40gb if re-carved (destroy free nothing; layout 2g.20gb + 1g.10gb + "
                "3g.40gb); no layout is changed") in event["message"], event["message"]
        assert get(box, "gpudevice", f"{node}-gpu0")["spec"]["mig"] == before
        assert not get(box, "pod", "big", "-n", namespace)["spec"].get("nodeName")
    finally:
        controller.stop()
